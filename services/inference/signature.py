"""What a model version takes and gives, read from its ONNX graph, and checking requests.

Dimensions the graph leaves open are -1; their symbolic names (e.g. `batch`, `seq`) say which
inputs and outputs share a dimension, so a request whose inputs disagree on a shared
dimension is refused, and a padded dimension can be cut back to each request's own length.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from strata.errors import InvalidArgument
from strata.models.onnxsig import TensorInfo
from strata.wire.codec import as_text, datatype_of


class Signature:
    """A model version's inputs and outputs, and the checks every request passes."""

    def __init__(
        self,
        model: str,
        inputs: Sequence[TensorInfo],
        outputs: Sequence[TensorInfo],
        max_batch_size: int,
        padded: Mapping[str, float],
    ) -> None:
        self.model = model
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.max_batch_size = max_batch_size
        self.padded = dict(padded)
        # Batching needs an open first dimension on every input and output.
        self.batchable = all(t.shape and t.shape[0] == -1 for t in [*self.inputs, *self.outputs])
        unknown = sorted(set(self.padded) - {t.name for t in self.inputs})
        if unknown:
            raise InvalidArgument(f"model {model!r}: padding names no input {unknown[0]!r}")

    def strings(self, arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """`arrays` with each string input as `str` elements (InvalidArgument naming the input
        and element where one is not UTF-8); the others as they are."""
        texts = {t.name for t in self.inputs if t.datatype == "BYTES"}
        return {
            name: as_text(array, f"input {name!r}") if name in texts else array
            for name, array in arrays.items()
        }

    @property
    def output_names(self) -> list[str]:
        return [t.name for t in self.outputs]

    def check(self, arrays: Mapping[str, np.ndarray]) -> tuple[int, Hashable]:
        """Raise InvalidArgument unless `arrays` fit; return (rows, batching key).

        Requests with equal keys may share a batch: their unpadded dimensions agree.
        """
        expected = {info.name: info for info in self.inputs}
        if set(arrays) != set(expected):
            raise InvalidArgument(
                f"model {self.model!r} takes inputs {sorted(expected)}, got {sorted(arrays)}"
            )
        for info in self.inputs:
            _check_tensor(info, arrays[info.name])
        self._check_shared_dims(arrays)
        rows = self._rows(arrays) if self.batchable else 1
        key = tuple(
            None if info.name in self.padded else arrays[info.name].shape[1:]
            for info in self.inputs
        )
        return rows, key

    def padded_length(self, arrays: Mapping[str, np.ndarray]) -> int:
        """The cells per row of the request's largest padded input (0: nothing is padded):
        what a batch pads every row of a shorter request up to."""
        sizes = [math.prod(arrays[name].shape[1:]) for name in self.padded]
        return max(sizes, default=0)

    def _rows(self, arrays: Mapping[str, np.ndarray]) -> int:
        rows: dict[str, int] = {name: array.shape[0] for name, array in arrays.items()}
        first = next(iter(rows.values()))
        if any(r != first for r in rows.values()):
            raise InvalidArgument(f"inputs disagree on the batch dimension: {rows}")
        if first < 1:
            raise InvalidArgument(f"model {self.model!r}: a request needs at least one row")
        if first > self.max_batch_size:
            name = next(iter(rows))
            raise InvalidArgument(
                f"input {name!r}: batch {first} exceeds {self.max_batch_size}, "
                f"the most model {self.model!r} takes"
            )
        return first

    def _check_shared_dims(self, arrays: Mapping[str, np.ndarray]) -> None:
        seen: dict[str, tuple[str, int]] = {}
        for info in self.inputs:
            for dim, size in zip(info.dims, arrays[info.name].shape, strict=True):
                if dim is None:
                    continue
                other = seen.setdefault(dim, (info.name, size))
                if other[1] != size:
                    raise InvalidArgument(
                        f"inputs {other[0]!r} and {info.name!r} share dimension {dim!r} "
                        f"but have sizes {other[1]} and {size}"
                    )


def _check_tensor(info: TensorInfo, array: np.ndarray) -> None:
    if datatype_of(array) != info.datatype:
        raise InvalidArgument(
            f"input {info.name!r}: datatype {datatype_of(array)}, expected {info.datatype}"
        )
    if array.ndim != len(info.shape) or any(
        d != -1 and d != s for d, s in zip(info.shape, array.shape, strict=True)
    ):
        raise InvalidArgument(
            f"input {info.name!r}: shape {list(array.shape)} does not fit {list(info.shape)}"
        )
