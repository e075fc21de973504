"""tritonclient against the gateway: metadata, config and the error cases, as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_probe.py URL
"""

import json
import sys

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException


def attempt(call):
    try:
        call()
    except InferenceServerException as exc:
        return {"status": str(exc.status()), "message": exc.message()}
    return {"status": "OK"}


def infer(client, model, name, array, datatype):
    tensor = tc.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return client.infer(model, [tensor])


def main(url):
    client = tc.InferenceServerClient(url)
    image = np.zeros((2, 8, 8), np.uint8)
    report = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(as_json=True),
        "metadata": {m: client.get_model_metadata(m, as_json=True) for m in ("digits", "tabular")},
        "config": {m: client.get_model_config(m, as_json=True) for m in ("digits", "tabular")},
        "model_ready": {m: client.is_model_ready(m) for m in ("digits", "tabular", "nope")},
        "errors": {
            "wrong_datatype": attempt(
                lambda: infer(client, "digits", "images", image.astype(np.float32), "FP32")
            ),
            "wrong_shape": attempt(
                lambda: infer(client, "digits", "images", image.reshape(2, 64), "UINT8")
            ),
            "unknown_input": attempt(lambda: infer(client, "digits", "pixels", image, "UINT8")),
            "unknown_pipeline": attempt(lambda: infer(client, "nope", "images", image, "UINT8")),
            "wrong_features": attempt(
                lambda: infer(client, "tabular", "features", np.zeros((1, 7), np.float32), "FP32")
            ),
        },
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
