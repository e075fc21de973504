"""tritonclient driving a decoupled pipeline (Triton's repeat_int32) on one stream, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_decoupled.py GRPC_URL HTTP_URL PIPELINE MAX_RESPONSES
As Triton's qa/L0_decoupled does: one_to_none, one_to_one and one_to_many, 1 and 5 requests
on one stream, each with and without enable_empty_final_response; every response as it
came (its request's id, OUT, IDX, its final flag). Then unary calls, which are refused, a
stream whose bad request fails alone, outputs asked into shared memory, a request past
MAX_RESPONSES, and the model config.
"""

import json
import os
import queue
import sys
import time

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

FINAL = "triton_final_response"
QUIET_SECONDS = 0.5  # how long a stream must stay silent after what was expected


def tensors(module, length, delays=None):
    """Triton's three inputs for `length` responses of 100, 101, ..."""
    values = {
        "IN": np.arange(100, 100 + length, dtype=np.int32),
        "DELAY": np.full(length if delays is None else delays, 1000, np.uint32),
        "WAIT": np.array([500], np.uint32),
    }
    made = []
    for name, data in values.items():
        tensor = module.InferInput(name, list(data.shape), "INT32" if name == "IN" else "UINT32")
        tensor.set_data_from_numpy(data)
        made.append(tensor)
    return made


def described(result, error):
    """One response of the stream as plain values."""
    if error is not None:
        return {"error": error.message()}
    response = result.get_response()
    flag = response.parameters.get(FINAL)
    out, idx = result.as_numpy("OUT"), result.as_numpy("IDX")
    return {
        "id": response.id,
        "OUT": None if out is None else out.tolist(),
        "IDX": None if idx is None else idx.tolist(),
        "final": None if flag is None else flag.bool_param,
    }


def streamed(url, pipeline, sent, expected):
    """Send `sent` (request id, length, delays, final flag) on one stream; every response
    that came, waiting for `expected` of them and then a quiet moment for any extra."""
    responses = queue.Queue()
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: responses.put((result, error)))
        for request_id, length, delays, final in sent:
            client.async_stream_infer(
                pipeline,
                tensors(grpcclient, length, delays),
                request_id=request_id,
                outputs=[grpcclient.InferRequestedOutput(n) for n in ("OUT", "IDX")],
                enable_empty_final_response=final,
            )
        got = []
        deadline = time.monotonic() + 30
        while len(got) < expected and time.monotonic() < deadline:
            try:
                got.append(described(*responses.get(timeout=1)))
            except queue.Empty:
                continue
        time.sleep(QUIET_SECONDS)
        while not responses.empty():
            got.append(described(*responses.get()))
        client.stop_stream()
    return got


def decoupled(url, pipeline):
    """Triton's cases: (requests on the stream, responses each) with and without final."""
    report = {}
    for requests, repeat in [(1, 0), (5, 0), (1, 1), (5, 1), (1, 5), (5, 5)]:
        for final in (False, True):
            sent = [(str(i), repeat, None, final) for i in range(requests)]
            expected = requests * (repeat + (1 if final else 0))
            key = f"{requests}x{repeat}" + (" final" if final else "")
            report[key] = streamed(url, pipeline, sent, expected)
    return report


def into_shared_memory(url, pipeline):
    """A request that asks for OUT in a region of shared memory: every response would
    write over the last, so it is refused."""
    key = f"/strata_e2e_decoupled_{os.getpid()}"
    region = shm.create_shared_memory_region("out", key, 64)
    try:
        with grpcclient.InferenceServerClient(url) as client:
            client.register_system_shared_memory("out", key, 64)
            out = grpcclient.InferRequestedOutput("OUT")
            out.set_shared_memory("out", 64)
            answers = queue.Queue()
            client.start_stream(callback=lambda result, error: answers.put(error))
            client.async_stream_infer(pipeline, tensors(grpcclient, 2), outputs=[out])
            error = answers.get(timeout=30)
            client.stop_stream()
            client.unregister_system_shared_memory("out")
    finally:
        shm.destroy_shared_memory_region(region)
    return None if error is None else error.message()


def refused(call):
    try:
        call()
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return {"status": "OK"}


def main(grpc_url, http_url, pipeline, max_responses):
    grpc = grpcclient.InferenceServerClient(grpc_url)
    http = httpclient.InferenceServerClient(http_url)
    report = {
        "config": {
            "grpc": grpc.get_model_config(pipeline, as_json=True)["config"],
            "http": http.get_model_config(pipeline),
        },
        "streams": decoupled(grpc_url, pipeline),
        "unary": {
            "grpc": refused(lambda: grpc.infer(pipeline, tensors(grpcclient, 1))),
            "http": refused(lambda: http.infer(pipeline, tensors(httpclient, 1))),
        },
        # DELAY shorter than IN, then a good request: the first fails alone.
        "one_bad": streamed(grpc_url, pipeline, [("bad", 3, 2, True), ("good", 2, None, True)], 4),
        "shared_memory": into_shared_memory(grpc_url, pipeline),
        "too_many": streamed(grpc_url, pipeline, [("many", int(max_responses) + 1, None, True)], 1),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:5])
