"""One served model version: its ONNX Runtime session and the tensors it takes and gives."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from strata.codec import DTYPES, datatype_of
from strata.errors import InvalidArgument

log = logging.getLogger(__name__)

_ORT_TYPES = {
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
    """A graph input or output; -1 marks a dimension the graph leaves open."""

    name: str
    datatype: str
    shape: tuple[int, ...]


def _info(arg: ort.NodeArg) -> TensorInfo:
    shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
    return TensorInfo(arg.name, _ORT_TYPES.get(arg.type, arg.type), shape)


@dataclass
class SessionOptions:
    intra_op_threads: int = 1
    inter_op_threads: int = 1


def open_session(path: Path, options: SessionOptions) -> ort.InferenceSession:
    """An ONNX Runtime session; spinning is off since several processes share the cores."""
    so = ort.SessionOptions()
    so.intra_op_num_threads = options.intra_op_threads
    so.inter_op_num_threads = options.inter_op_threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])


class LoadedModel:
    """A model version ready to run: one session, reused for every call."""

    def __init__(
        self, name: str, version: str, session: ort.InferenceSession, max_batch_size: int
    ) -> None:
        self.name = name
        self.version = version
        self.max_batch_size = max_batch_size
        self._session = session
        self.inputs = [_info(arg) for arg in session.get_inputs()]
        self.outputs = [_info(arg) for arg in session.get_outputs()]

    def check(self, arrays: dict[str, np.ndarray]) -> None:
        """Raise InvalidArgument unless `arrays` are exactly this model's inputs."""
        expected = {info.name: info for info in self.inputs}
        if set(arrays) != set(expected):
            raise InvalidArgument(
                f"model {self.name!r} takes inputs {sorted(expected)}, got {sorted(arrays)}"
            )
        for name, array in arrays.items():
            info = expected[name]
            if datatype_of(array) != info.datatype:
                raise InvalidArgument(
                    f"input {name!r}: datatype {datatype_of(array)}, expected {info.datatype}"
                )
            if array.ndim != len(info.shape) or any(
                d != -1 and d != s for d, s in zip(info.shape, array.shape, strict=True)
            ):
                raise InvalidArgument(
                    f"input {name!r}: shape {list(array.shape)} does not fit {list(info.shape)}"
                )
            if array.shape and array.shape[0] > self.max_batch_size:
                raise InvalidArgument(
                    f"input {name!r}: batch {array.shape[0]} exceeds {self.max_batch_size}"
                )

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the session (blocking: call it from a worker thread)."""
        names = [info.name for info in self.outputs]
        results = self._session.run(names, arrays)
        return dict(zip(names, results, strict=True))

    def zeros(self) -> dict[str, np.ndarray]:
        """Inputs of batch 1 (open dimensions 1) filled with zeros, for warming."""
        return {
            info.name: np.zeros([max(d, 1) for d in info.shape], dtype=DTYPES[info.datatype])
            for info in self.inputs
        }
