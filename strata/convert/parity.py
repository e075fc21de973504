"""Does the ONNX model compute what the PyTorch model computes? Measured per output.

Every sample batch runs through both. Per output, the maximum absolute difference over all
elements and the lowest cosine similarity over all rows (each row flattened) are measured;
the conversion is refused unless every output is within both bounds of the tolerance.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
import torch

from strata.convert.source import ParityError, Source
from strata.wire.codec import Arrays


@dataclass(frozen=True)
class Tolerance:
    """The most an output may differ: absolute, per element, and cosine, per row."""

    atol: float
    min_cosine: float

    def describe(self) -> str:
        return f"max |diff| <= {self.atol:g} and cosine >= {self.min_cosine:g}"


# fp32 kernels differ only in summation order. int8 moves every output a little, and very
# short texts most: MiniLM's rows average cosine 0.99 to fp32, the worst ("hi") 0.978.
FP32 = Tolerance(atol=1e-4, min_cosine=0.9999)
INT8 = Tolerance(atol=0.1, min_cosine=0.97)


@dataclass(frozen=True)
class OutputParity:
    """How one output of the ONNX model compares with PyTorch's over every sample."""

    name: str
    max_abs_diff: float
    min_cosine: float
    rows: int

    def within(self, tolerance: Tolerance) -> bool:
        # Written so that NaN fails both comparisons.
        return self.max_abs_diff <= tolerance.atol and self.min_cosine >= tolerance.min_cosine


def reference_outputs(source: Source) -> list[Arrays]:
    """PyTorch's outputs for every sample."""
    source.module.eval()
    names = [d.name for d in source.outputs]
    results = []
    with torch.inference_mode():
        for sample in source.samples:
            args = [torch.from_numpy(np.ascontiguousarray(sample[d.name])) for d in source.inputs]
            got = source.module(*args)
            tensors = got if isinstance(got, tuple | list) else (got,)
            if len(tensors) != len(names):
                raise ParityError(
                    f"the module returns {len(tensors)} outputs, {len(names)} are declared"
                )
            results.append(
                {n: t.detach().cpu().numpy() for n, t in zip(names, tensors, strict=True)}
            )
    return results


def onnx_outputs(session: ort.InferenceSession, source: Source) -> list[Arrays]:
    """ONNX Runtime's outputs for every sample."""
    names = [d.name for d in source.outputs]
    return [dict(zip(names, session.run(names, sample), strict=True)) for sample in source.samples]


def compare(
    source: Source, reference: Sequence[Arrays], got: Sequence[Arrays]
) -> list[OutputParity]:
    """Per output: the worst absolute difference and the worst row cosine over all samples."""
    parities = []
    for decl in source.outputs:
        diffs, cosines, rows = [], [], 0
        for want, have in zip(reference, got, strict=True):
            a, b = _as_float(want[decl.name]), _as_float(have[decl.name])
            if a.shape != b.shape:
                raise ParityError(
                    f"output {decl.name!r}: ONNX gives shape {list(b.shape)}, "
                    f"PyTorch {list(a.shape)}"
                )
            diffs.append(float(np.max(np.abs(a - b))) if a.size else 0.0)
            cosines.append(row_cosines(a, b).min(initial=1.0))
            rows += len(a)
        # numpy, not the builtins, so that a NaN anywhere carries through and fails the check.
        worst = OutputParity(decl.name, float(np.max(diffs)), float(np.min(cosines)), rows)
        parities.append(worst)
    return parities


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row (flattened); two zero rows count as identical."""
    a, b = a.reshape(len(a), -1), b.reshape(len(b), -1)
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.einsum("ij,ij->i", a, b)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        cosines = np.where(norms > 0, dots / norms, 0.0)
    return np.where(both_zero, 1.0, cosines)


def check(parities: Sequence[OutputParity], tolerance: Tolerance) -> None:
    """Raise ParityError naming every output outside the tolerance."""
    failed = [p for p in parities if not p.within(tolerance)]
    if failed:
        lines = [
            f"  {p.name}: max |diff| {p.max_abs_diff:.3g}, min cosine {p.min_cosine:.6f}"
            for p in failed
        ]
        raise ParityError(
            "the ONNX model does not match the PyTorch model "
            f"(tolerance: {tolerance.describe()}):\n" + "\n".join(lines)
        )


def _as_float(array: np.ndarray) -> np.ndarray:
    return array.astype(np.float64, copy=False)
