"""Embedding rules: mean pooling over tokens (with the attention mask) and L2 normalisation.

These match sentence-transformers' pooling: padded tokens do not count, a row with no tokens
pools to zeros, and a zero vector stays zero when normalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from services.postprocess.rules.base import RULES
from strata.codec import Arrays
from strata.config.postprocess import L2NormalizeRule, MeanPoolRule
from strata.errors import InvalidArgument
from strata.plugins import RuleContext, numbers

# sentence-transformers' floors: token counts (clamp min=1e-9) and norms (F.normalize eps).
_MIN_COUNT = 1e-9
_MIN_NORM = 1e-12


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit length along the last axis (FP32)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return (vectors / np.maximum(norms, _MIN_NORM)).astype(np.float32)


@dataclass
class MeanPool:
    """Token embeddings [batch, tokens, dim] to [batch, dim], averaging unmasked tokens."""

    bounded: ClassVar[bool] = True

    input: str
    output: str
    mask: str | None = None
    normalize: bool = False
    name: str = "mean_pool"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,) if self.mask is None else (self.input, self.mask)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        tokens = numbers(tensors, self.input, self.name)
        if tokens.ndim != 3:
            raise InvalidArgument(
                f"{self.name} needs {self.input!r} as [batch, tokens, dim], "
                f"got shape {list(tokens.shape)}"
            )
        weights = self._weights(tensors, tokens.shape[:2])
        summed = np.einsum("btd,bt->bd", tokens, weights)
        counts = np.maximum(weights.sum(axis=1, keepdims=True), _MIN_COUNT)
        pooled = (summed / counts).astype(np.float32)
        return {**tensors, self.output: l2_normalize(pooled) if self.normalize else pooled}

    def _weights(self, tensors: Arrays, shape: tuple[int, ...]) -> np.ndarray:
        if self.mask is None:
            return np.ones(shape, dtype=np.float32)
        mask = numbers(tensors, self.mask, self.name)
        if mask.shape != shape:
            raise InvalidArgument(
                f"{self.name}: mask {self.mask!r} has shape {list(mask.shape)}, "
                f"expected {list(shape)} to match {self.input!r}"
            )
        return mask


@dataclass
class L2Normalize:
    bounded: ClassVar[bool] = True

    input: str
    output: str
    name: str = "l2_normalize"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        return {**tensors, self.output: l2_normalize(numbers(tensors, self.input, self.name))}


@RULES.register("mean_pool")
def _build_mean_pool(spec: MeanPoolRule, base_dir: Path) -> MeanPool:
    return MeanPool(
        input=spec.input,
        output=spec.output or spec.input,
        mask=spec.mask,
        normalize=spec.normalize,
    )


@RULES.register("l2_normalize")
def _build_l2_normalize(spec: L2NormalizeRule, base_dir: Path) -> L2Normalize:
    return L2Normalize(input=spec.input, output=spec.output or spec.input)
