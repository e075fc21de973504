"""Classification rules: softmax, top-k, and mapping class indices to label names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from services.postprocess.rules.base import RULES, Tensors
from strata.stages import take


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in FP32."""
    shifted = logits.astype(np.float32) - logits.max(axis=axis, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=axis, keepdims=True)


@dataclass
class Softmax:
    input: str
    output: str
    name: str = "softmax"

    def apply(self, tensors: Tensors) -> Tensors:
        return {**tensors, self.output: softmax(take(tensors, self.input, self.name))}


@dataclass
class TopK:
    """The k largest scores per row, best first, with their class indices."""

    input: str
    k: int
    values: str
    indices: str
    name: str = "topk"

    def apply(self, tensors: Tensors) -> Tensors:
        scores = take(tensors, self.input, self.name)
        k = min(self.k, scores.shape[-1])
        order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
        top = np.take_along_axis(scores, order, axis=-1)
        return {**tensors, self.values: top, self.indices: order.astype(np.int64)}


@dataclass
class Labels:
    """Class indices to label names (BYTES)."""

    input: str
    output: str
    labels: Sequence[str]
    name: str = "labels"

    def __post_init__(self) -> None:
        self._table = np.array([label.encode() for label in self.labels], dtype=object)

    def apply(self, tensors: Tensors) -> Tensors:
        indices = take(tensors, self.input, self.name)
        return {**tensors, self.output: self._table[indices]}


@RULES.register("softmax")
def _build_softmax(options: Mapping[str, Any], base_dir: Path) -> Softmax:
    return Softmax(input=options["input"], output=options.get("output", options["input"]))


@RULES.register("topk")
def _build_topk(options: Mapping[str, Any], base_dir: Path) -> TopK:
    k = int(options["k"])
    if k < 1:
        raise ValueError(f"topk: k must be at least 1, got {k}")
    return TopK(input=options["input"], k=k, values=options["values"], indices=options["indices"])


@RULES.register("labels")
def _build_labels(options: Mapping[str, Any], base_dir: Path) -> Labels:
    labels = options["labels"]
    if not labels or not all(isinstance(label, str) for label in labels):
        raise ValueError("labels: 'labels' must be a non-empty list of strings")
    return Labels(input=options["input"], output=options["output"], labels=labels)
