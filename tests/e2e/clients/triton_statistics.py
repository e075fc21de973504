"""tritonclient's get_inference_statistics against the gateway, around a few requests, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_statistics.py URL PIPELINE GOOD BAD ROWS
Sends GOOD requests of ROWS rows each to the tabular-shaped PIPELINE and BAD ones of the
wrong shape; prints its statistics before and after, all pipelines' names, and what asking
for an unknown pipeline answers.
"""

import json
import sys

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException


def infer(client, pipeline, features):
    tensor = tc.InferInput("features", list(features.shape), "FP32")
    tensor.set_data_from_numpy(features)
    try:
        client.infer(pipeline, [tensor])
    except InferenceServerException as exc:
        return str(exc.status())
    return "OK"


def statistics(client, name):
    try:
        return client.get_inference_statistics(name, as_json=True)
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}


def main(url, pipeline, good, bad, rows):
    client = tc.InferenceServerClient(url)
    before = statistics(client, pipeline)
    codes = [infer(client, pipeline, np.zeros((rows, 30), np.float32)) for _ in range(good)]
    codes += [infer(client, pipeline, np.zeros((1, 7), np.float32)) for _ in range(bad)]
    report = {
        "codes": codes,
        "before": before,
        "after": statistics(client, pipeline),
        "all": [s["name"] for s in statistics(client, "")["model_stats"]],
        "unknown": statistics(client, "nope"),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    url, pipeline, *numbers = sys.argv[1:]
    main(url, pipeline, *map(int, numbers))
