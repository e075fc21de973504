"""Embedding rules: mean pooling over tokens (with the attention mask) and L2 normalisation.

These match sentence-transformers' pooling: padded tokens do not count, a row with no tokens
pools to zeros, and a zero vector stays zero when normalised.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from services.postprocess.rules.base import RULES, OneInput
from strata.config.postprocess import L2NormalizeRule, MeanPoolRule
from strata.errors import InvalidArgument
from strata.plugins import RuleContext, numbers
from strata.wire.codec import Arrays

# sentence-transformers' floors: token counts (clamp min=1e-9) and norms (F.normalize eps).
_MIN_COUNT = 1e-9
_MIN_NORM = 1e-12


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Unit length along the last axis (FP32)."""
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    unit: np.ndarray = (vectors / np.maximum(norms, _MIN_NORM)).astype(np.float32)
    return unit


@RULES.register("mean_pool")
@dataclass
class MeanPool:
    """Token embeddings [batch, tokens, dim] to [batch, dim], averaging unmasked tokens."""

    bounded: ClassVar[bool] = True

    options: MeanPoolRule

    @property
    def inputs(self) -> tuple[str, ...]:
        mask = self.options.mask
        return (self.options.input,) if mask is None else (self.options.input, mask)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        source, kind = self.options.input, self.options.kind
        tokens = numbers(tensors, source, kind)
        if tokens.ndim != 3:
            raise InvalidArgument(
                f"{kind} needs {source!r} as [batch, tokens, dim], got shape {list(tokens.shape)}"
            )
        weights = self._weights(tensors, tokens.shape[:2])
        summed = np.einsum("btd,bt->bd", tokens, weights)
        counts = np.maximum(weights.sum(axis=1, keepdims=True), _MIN_COUNT)
        pooled = (summed / counts).astype(np.float32)
        normalized = l2_normalize(pooled) if self.options.normalize else pooled
        return {**tensors, self.options.target: normalized}

    def _weights(self, tensors: Arrays, shape: tuple[int, ...]) -> np.ndarray:
        mask = self.options.mask
        if mask is None:
            return np.ones(shape, dtype=np.float32)
        weights = numbers(tensors, mask, self.options.kind)
        if weights.shape != shape:
            raise InvalidArgument(
                f"{self.options.kind}: mask {mask!r} has shape {list(weights.shape)}, "
                f"expected {list(shape)} to match {self.options.input!r}"
            )
        return weights


@RULES.register("l2_normalize")
@dataclass
class L2Normalize(OneInput):
    bounded: ClassVar[bool] = True

    options: L2NormalizeRule

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        vectors = numbers(tensors, self.options.input, self.options.kind)
        return {**tensors, self.options.target: l2_normalize(vectors)}
