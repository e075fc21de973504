"""KServe's Python model server for the digits model: runs in KServe's venv, as two processes.

`python kserve_digits.py predictor --model_path model.onnx --grpc_port P --http_port Q`
serves the ONNX file as a v2 model (`pixels` FP32 [batch, 64] -> `logits`);
`python kserve_digits.py transformer --predictor_host 127.0.0.1:P --predictor_protocol grpc-v2
--grpc_port R --http_port S` is the layered front: it takes the pipeline's own input (`images`
UINT8 [batch, 8, 8], pixels 0-255), scales and flattens it, calls the predictor over v2 gRPC,
and answers the top 3 `labels` (BYTES) and `scores` (FP32) as Strata's digits pipeline does.
"""

from __future__ import annotations

import argparse

import numpy as np
import onnxruntime
from kserve import (
    InferInput,
    InferOutput,
    InferRequest,
    InferResponse,
    Model,
    ModelServer,
    model_server,
)

NAME = "digits"
LABELS = np.array([str(d).encode() for d in range(10)], dtype=object)


class Predictor(Model):
    """The ONNX file in one CPU session with one thread."""

    def __init__(self, name: str, path: str) -> None:
        super().__init__(name)
        self._path = path
        self.load()

    def load(self) -> bool:
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        providers = ["CPUExecutionProvider"]
        self._session = onnxruntime.InferenceSession(self._path, options, providers=providers)
        self.ready = True
        return self.ready

    async def predict(self, payload: InferRequest, headers=None, response_headers=None):
        feeds = {i.name: i.as_numpy() for i in payload.inputs}
        names = [o.name for o in self._session.get_outputs()]
        results = self._session.run(names, feeds)
        outputs = [_output(n, r) for n, r in zip(names, results, strict=True)]
        return InferResponse(payload.id, self.name, outputs)


class Transformer(Model):
    """Pre- and postprocessing around the predictor, which the base class calls over gRPC."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    async def preprocess(self, payload: InferRequest, headers=None) -> InferRequest:
        images = payload.inputs[0].as_numpy()
        pixels = (images.astype(np.float32) / 255.0).reshape(len(images), -1)
        tensor = InferInput("pixels", list(pixels.shape), "FP32")
        tensor.set_data_from_numpy(pixels)
        return InferRequest(self.name, [tensor], request_id=payload.id)

    async def postprocess(self, response: InferResponse, headers=None, response_headers=None):
        logits = response.outputs[0].as_numpy()
        exp = np.exp(logits - logits.max(axis=1, keepdims=True))
        probabilities = exp / exp.sum(axis=1, keepdims=True)
        top = np.argsort(-probabilities, axis=1)[:, :3]
        scores = np.take_along_axis(probabilities, top, axis=1)
        outputs = [_output("labels", LABELS[top], "BYTES"), _output("scores", scores)]
        return InferResponse(response.id, self.name, outputs)


def _output(name: str, array: np.ndarray, datatype: str = "FP32") -> InferOutput:
    output = InferOutput(name, list(array.shape), datatype)
    output.set_data_from_numpy(array)
    return output


def main() -> None:
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    parser.add_argument("role", choices=["predictor", "transformer"])
    parser.add_argument("--model_path", help="the ONNX file (predictor)")
    args, _ = parser.parse_known_args()
    model = Predictor(NAME, args.model_path) if args.role == "predictor" else Transformer(NAME)
    ModelServer().start([model])


if __name__ == "__main__":
    main()
