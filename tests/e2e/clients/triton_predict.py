"""Send a data set through a pipeline with tritonclient; print the top labels as JSON.

usage: triton_predict.py URL PIPELINE NPZ INPUT_KEY INPUT_NAME OUTPUT BATCH
"""

import json
import sys

import numpy as np
import tritonclient.grpc as tc


def main(url, pipeline, npz, key, input_name, output, batch):
    client = tc.InferenceServerClient(url)
    data = np.load(npz)[key]
    datatype = "UINT8" if data.dtype == np.uint8 else "FP32"
    labels = []
    for start in range(0, len(data), int(batch)):
        rows = data[start : start + int(batch)]
        tensor = tc.InferInput(input_name, list(rows.shape), datatype)
        tensor.set_data_from_numpy(rows)
        result = client.infer(pipeline, [tensor], outputs=[tc.InferRequestedOutput(output)])
        labels += [row[0].decode() for row in result.as_numpy(output)]
    print(json.dumps(labels))


if __name__ == "__main__":
    main(*sys.argv[1:])
