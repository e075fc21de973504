"""The gateway's REST API through tritonclient.http, as users call it; everything seen as JSON.

Run in its own process (tritonclient and Strata's stubs register the same protobuf names).
usage: triton_http.py URL PIPELINE NPY INPUT ARM...
Asks whether the server and PIPELINE are live and ready and for their metadata, then sends
the array in NPY as INPUT to each forced ARM (`strata.arm`) twice: as JSON data both ways,
and as binary data both ways; prints each answer's parameters and outputs (JSON data as
the lists the server sent, binary data as base64 of the v2 raw bytes) and the statistics.
"""

import base64
import json
import struct
import sys

import numpy as np
import tritonclient.http as tc

DATATYPES = {np.dtype(np.uint8): "UINT8", np.dtype(np.float32): "FP32"}


def raw(array: np.ndarray, datatype: str) -> bytes:
    """The v2 raw bytes of an output (BYTES: each element length-prefixed, little-endian)."""
    if datatype != "BYTES":
        return array.tobytes()
    return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1))


def infer(client, pipeline, array, input_name, outputs, arm, binary):
    tensor = tc.InferInput(input_name, list(array.shape), DATATYPES[array.dtype])
    tensor.set_data_from_numpy(array, binary_data=binary)
    wanted = [tc.InferRequestedOutput(name, binary_data=binary) for name in outputs]
    result = client.infer(pipeline, [tensor], outputs=wanted, parameters={"strata.arm": arm})
    answer = {"parameters": result.get_response().get("parameters", {}), "outputs": {}}
    for name in outputs:
        output = result.get_output(name)
        seen = {"datatype": output["datatype"], "shape": output["shape"]}
        if binary:
            values = raw(result.as_numpy(name), output["datatype"])
            seen["base64"] = base64.b64encode(values).decode()
        else:
            seen["data"] = output["data"]
        answer["outputs"][name] = seen
    return answer


def main(url, pipeline, npy, input_name, *arms):
    client = tc.InferenceServerClient(url)
    array = np.load(npy)
    metadata = client.get_model_metadata(pipeline)
    outputs = [output["name"] for output in metadata["outputs"]]
    report = {
        "live": client.is_server_live(),
        "ready": client.is_server_ready(),
        "server": client.get_server_metadata(),
        "metadata": metadata,
        "model_ready": client.is_model_ready(pipeline),
        "answers": {
            arm: {
                kind: infer(client, pipeline, array, input_name, outputs, arm, kind == "binary")
                for kind in ("json", "binary")
            }
            for arm in arms
        },
        "statistics": client.get_inference_statistics(pipeline),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main(*sys.argv[1:])
