"""A model version's inputs and outputs as its ONNX graph declares them.

The inference service serves them; preprocess and postprocess read them at start to check
that a pipeline's steps and rules fit the model they surround (strata.wiring).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnxruntime as ort

ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output; -1 marks an open dimension, `dims` holds symbolic names."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dims: tuple[str | None, ...]

    @classmethod
    def of(cls, arg: ort.NodeArg) -> TensorInfo:
        """From an ONNX Runtime graph input or output."""
        shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
        dims = tuple(d if isinstance(d, str) and d else None for d in arg.shape)
        return cls(arg.name, ORT_TYPES.get(arg.type, arg.type), shape, dims)


def read(path: Path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs of the ONNX model at `path` (ValueError if it cannot be read).

    The graph is opened unoptimised on one thread and let go at once."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime raises its own exception types for bad files
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise ValueError(f"cannot read {path.parent.name}/{path.name}: {first}") from None
    return (
        [TensorInfo.of(arg) for arg in session.get_inputs()],
        [TensorInfo.of(arg) for arg in session.get_outputs()],
    )
