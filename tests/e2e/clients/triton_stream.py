"""tritonclient's bidirectional stream against the gateway; prints each answer as JSON.

usage: triton_stream.py URL COUNT
"""

import json
import sys
import threading

import numpy as np
import tritonclient.grpc as tc


def main(url: str, count: str) -> None:
    client = tc.InferenceServerClient(url)
    answers, lock = [], threading.Lock()

    def collect(result, error) -> None:
        with lock:
            if error is not None:
                answers.append({"error": str(error)})
            else:
                response = result.get_response()
                answers.append({"id": response.id, "labels": result.as_numpy("labels").tolist()})

    client.start_stream(callback=collect)
    for i in range(int(count)):
        image = np.zeros((1, 8, 8), np.uint8) if i % 2 == 0 else np.zeros((1, 8, 8), np.float32)
        tensor = tc.InferInput("images", list(image.shape), "UINT8" if i % 2 == 0 else "FP32")
        tensor.set_data_from_numpy(image)
        client.async_stream_infer("digits", [tensor], request_id=str(i))
    client.stop_stream()
    print(json.dumps(answers, default=lambda b: b.decode()))


if __name__ == "__main__":
    main(*sys.argv[1:])
