"""tritonclient (gRPC and HTTP) driving sequences through a stateful pipeline, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_sequences.py GRPC_URL HTTP_URL PIPELINE STATELESS_PIPELINE [LIMIT IDLE_SECONDS]
With LIMIT and IDLE_SECONDS it checks the pipeline's limits instead: LIMIT sequences live at
once, and a sequence idle longer than IDLE_SECONDS gone.
The pipeline adds each request's `value` to its sequence's running total (models/
accumulator.py). Each part runs on both protocols; ids differ per protocol, so the two never
share a sequence.
"""

import json
import sys
import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def attempt(call):
    try:
        return {"status": str(call())}
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}


def value(module, number, datatype="FP32", rows=1):
    data = np.full((rows, 1), number, dtype=np.float32 if datatype == "FP32" else np.float64)
    tensor = module.InferInput("value", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return [tensor]


def step(module, client, pipeline, sequence, number, start=False, end=False):
    """One request of a sequence: its total, the control inputs the model saw, its id."""
    result = client.infer(
        pipeline,
        value(module, number),
        sequence_id=sequence,
        sequence_start=start,
        sequence_end=end,
    )
    return {
        "total": result.as_numpy("total").item(),
        "controls": result.as_numpy("controls").tolist()[0],
        "corrid": result.as_numpy("corrid").item().decode(),
    }


def interleaved(module, client, pipeline, base):
    """Three sequences (two uint64 ids, one string id) whose requests alternate."""
    ids = [base + 1, base + 2, f"text-{base}"]
    answers = {str(i): [] for i in ids}
    for index, number in enumerate([1, 2, 3, 4]):
        for offset, sequence in enumerate(ids):
            answer = step(
                module,
                client,
                pipeline,
                sequence,
                number * (offset + 1),
                start=index == 0,
                end=index == 3,
            )
            answers[str(sequence)].append(answer)
    return answers


def refusals(module, client, pipeline, stateless, base):
    """After its END a sequence is gone; an unknown one needs START; a bad request of a
    sequence is refused and leaves its total as it was."""
    done, unknown, live = base + 1, base + 2, base + 3
    step(module, client, pipeline, done, 5, start=True, end=True)
    step(module, client, pipeline, live, 5, start=True)
    bad = {
        "datatype": attempt(
            lambda: client.infer(pipeline, value(module, 1, "FP64"), sequence_id=live)
        ),
        "rows": attempt(lambda: client.infer(pipeline, value(module, 1, rows=2), sequence_id=live)),
    }
    return {
        "after_end": attempt(lambda: step(module, client, pipeline, done, 1)),
        "unknown": attempt(lambda: step(module, client, pipeline, unknown, 1)),
        "bad": bad,
        "after_bad": step(module, client, pipeline, live, 1, end=True),
        "no_id": attempt(lambda: client.infer(pipeline, value(module, 1))),
        "stateless": attempt(
            lambda: client.infer(stateless, value(module, 1), sequence_id=base, sequence_start=True)
        ),
    }


def streamed(client, pipeline, base, count=4, length=5):
    """`count` sequences on one stream, every request sent before any answer: each must
    still run in its sequence's order."""
    answers, lock, done = [], threading.Lock(), threading.Event()
    expected = count * length

    def collect(result, error):
        with lock:
            if error is not None:
                answers.append({"error": str(error)})
            else:
                answers.append(
                    {
                        "id": result.get_response().id,
                        "total": result.as_numpy("total").item(),
                    }
                )
            if len(answers) == expected:
                done.set()

    client.start_stream(callback=collect)
    for index in range(length):
        for sequence in range(count):
            client.async_stream_infer(
                pipeline,
                value(grpcclient, 1),
                request_id=f"{sequence}:{index}",
                sequence_id=base + sequence,
                sequence_start=index == 0,
                sequence_end=index == length - 1,
            )
    done.wait(60)
    client.stop_stream()
    return answers


def limits(grpc, http, pipeline, limit, idle):
    """LIMIT live sequences, then one more is refused; once they have idled out, a new one
    starts and an old one is gone."""
    started = [step(grpcclient, grpc, pipeline, 6000 + i, 1, start=True) for i in range(limit)]
    report = {
        "started": len(started),
        "past_limit": attempt(lambda: step(httpclient, http, pipeline, 7000, 1, start=True)),
    }
    time.sleep(idle + 0.5)
    report["expired"] = attempt(lambda: step(grpcclient, grpc, pipeline, 6000, 1))
    report["after_idle"] = step(httpclient, http, pipeline, 7000, 2, start=True)
    return report


def main(grpc_url, http_url, pipeline, stateless, limit="", idle=""):
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http = httpclient.InferenceServerClient(http_url)
    if limit:
        print(json.dumps(limits(grpc, http, pipeline, int(limit), float(idle))))
        return
    report = {
        "config": {
            "grpc": grpc.get_model_config(pipeline, as_json=True)["config"],
            "http": http.get_model_config(pipeline),
        },
        "extensions": grpc.get_server_metadata(as_json=True)["extensions"],
        "interleaved": {
            "grpc": interleaved(grpcclient, grpc, pipeline, 1000),
            "http": interleaved(httpclient, http, pipeline, 2000),
        },
        "refusals": {
            "grpc": refusals(grpcclient, grpc, pipeline, stateless, 3000),
            "http": refusals(httpclient, http, pipeline, stateless, 4000),
        },
        "streamed": streamed(grpc, pipeline, 5000),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:7])
