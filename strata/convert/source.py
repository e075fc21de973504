"""What a conversion starts from: a PyTorch module, what it takes and gives, sample inputs.

A `Source` is everything the exporter, the parity check and the entry writer need to know
about a model, whatever it was loaded from (a factory function, a sentence-transformers
folder). Sample inputs are whole batches; each is run through PyTorch and through ONNX
Runtime, and the first few become the entry's validation cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from strata.wire.codec import Arrays

Dim = int | str


class ConversionError(Exception):
    """The model cannot be converted as asked; the message says what to change."""


class ParityError(ConversionError):
    """The ONNX model does not reproduce the PyTorch model within the tolerance."""


@dataclass(frozen=True)
class TensorDecl:
    """A graph input or output: its name, numpy dtype and dimensions.

    A dimension given as a string is dynamic and named (`batch`, `sequence`); inputs and
    outputs that share a name share the dimension. The first dimension is the batch.
    """

    name: str
    dtype: str
    dims: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if not self.dims or not isinstance(self.dims[0], str):
            raise ConversionError(
                f"tensor {self.name!r}: the first dimension must be a named batch dimension, "
                f"got {list(self.dims)}"
            )
        np.dtype(self.dtype)  # a bad name raises here, not deep in the exporter

    @property
    def dynamic_axes(self) -> dict[int, str]:
        return {axis: dim for axis, dim in enumerate(self.dims) if isinstance(dim, str)}


@dataclass
class Source:
    """A PyTorch model ready to export.

    `module` is called with the inputs positionally, in declaration order, and returns one
    tensor or a tuple of tensors in the order of `outputs`.
    """

    module: Any  # torch.nn.Module; typed loosely so this file imports without torch
    inputs: list[TensorDecl]
    outputs: list[TensorDecl]
    samples: list[Arrays]
    description: str
    # ONNX Runtime's transformer optimiser model type ("bert"), with the attention geometry.
    model_type: str | None = None
    num_heads: int = 0
    hidden_size: int = 0
    # Inputs the inference batcher pads to the longest in a batch, with the pad value.
    padding: dict[str, float] = field(default_factory=dict)
    # Files copied into the version folder beside model.onnx (e.g. tokenizer.json).
    files: dict[str, Path] = field(default_factory=dict)
    # Keys added to model.yaml (e.g. labels), and facts recorded in the conversion report.
    manifest: dict[str, Any] = field(default_factory=dict)
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.samples:
            raise ConversionError(f"{self.description}: no sample inputs to check parity on")
        names = [decl.name for decl in self.inputs]
        for index, sample in enumerate(self.samples):
            if sorted(sample) != sorted(names):
                raise ConversionError(
                    f"sample {index} has inputs {sorted(sample)}, the model takes {sorted(names)}"
                )
        unknown = sorted(set(self.padding) - set(names))
        if unknown:
            raise ConversionError(f"padding names {unknown[0]!r}, which is not an input")


def rows(sample: Arrays) -> int:
    """The batch size of a sample."""
    return len(next(iter(sample.values())))


def random_samples(
    inputs: Sequence[TensorDecl], batches: Sequence[int], seed: int = 0, int_high: int = 100
) -> list[Arrays]:
    """Seeded random batches: floats from N(0, 1), integers from [0, int_high), booleans.

    Each batch draws its own length for every named non-batch dimension (1 to 8), so the
    parity check sees shapes other than the one the exporter traced.
    """
    rng = np.random.default_rng(seed)
    samples = []
    for batch in batches:
        sizes = {str(decl.dims[0]): batch for decl in inputs}
        sample = {}
        for decl in inputs:
            shape = [_size(dim, sizes, rng) for dim in decl.dims]
            sample[decl.name] = _draw(rng, np.dtype(decl.dtype), shape, int_high)
        samples.append(sample)
    return samples


def _size(dim: Dim, sizes: dict[str, int], rng: np.random.Generator) -> int:
    if isinstance(dim, int):
        return dim
    if dim not in sizes:
        sizes[dim] = int(rng.integers(1, 9))
    return sizes[dim]


def _draw(rng: np.random.Generator, dtype: np.dtype, shape: list[int], high: int) -> np.ndarray:
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(bool)
    if dtype.kind in "iu":
        return rng.integers(0, high, shape).astype(dtype)
    raise ConversionError(f"cannot draw sample inputs of dtype {dtype}; pass samples instead")
