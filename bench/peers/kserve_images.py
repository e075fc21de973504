"""KServe's Python model server for the image workload: runs in KServe's venv, as two processes.

`python kserve_images.py predictor --model_path model.onnx --grpc_port P --http_port Q`
serves the ONNX file as a v2 model (`image` FP32 [batch, 3, 224, 224] -> `logits`);
`python kserve_images.py transformer --predictor_host 127.0.0.1:P --predictor_protocol grpc-v2
--grpc_port R --http_port S` is the layered front: it takes the pipeline's own input (`image`
BYTES [batch], JPEGs), runs bench/peers/photo.py's steps on each, calls the predictor over v2
gRPC with the pixels, and answers the top 5 `scores` (FP32) and `classes` (INT64) as
Strata's images pipeline does.
"""

from __future__ import annotations

import argparse

import numpy as np
from kserve import InferInput, InferRequest, InferResponse, Model, ModelServer, model_server
from kserve_digits import Predictor, _output
from photo import reference, top5

NAME = "images"


class Transformer(Model):
    """The steps before the predictor and softmax with the top 5 after; the base class calls
    the predictor over gRPC."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    async def preprocess(self, payload: InferRequest, headers=None) -> InferRequest:
        photos = payload.inputs[0].as_numpy().reshape(-1)
        pixels = np.stack([reference(bytes(photo)) for photo in photos])
        tensor = InferInput("image", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        return InferRequest(self.name, [tensor], request_id=payload.id)

    async def postprocess(self, response: InferResponse, headers=None, response_headers=None):
        scores, classes = top5(response.outputs[0].as_numpy())
        outputs = [_output("scores", scores), _output("classes", classes, "INT64")]
        return InferResponse(response.id, self.name, outputs)


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("role", choices=["predictor", "transformer"])
    parser.add_argument("--model_path", help="the ONNX file (predictor)")
    args, _ = parser.parse_known_args()
    model = Predictor(NAME, args.model_path) if args.role == "predictor" else Transformer(NAME)
    ModelServer().start([model])


if __name__ == "__main__":
    main()
