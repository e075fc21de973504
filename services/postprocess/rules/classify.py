"""Classification rules: softmax, sigmoid, threshold, sort, top-k, and label mapping."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from services.postprocess.rules.base import (
    RULES,
    Misconfigured,
    RuleContext,
    load_list,
    numbers,
    take,
)
from strata.codec import Arrays
from strata.errors import InvalidArgument


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in FP32 (the rules refuse NaN and infinities before it).

    A row with +inf shares its probability among its +inf entries; a row of only -inf is
    uniform; NaN makes its row NaN.
    """
    values = logits.astype(np.float32, copy=False)
    top = values.max(axis=axis, keepdims=True)
    with np.errstate(invalid="ignore"):
        # Equal to the maximum counts as 0 even when both are infinite (inf - inf is NaN).
        shifted = np.where(values == top, np.float32(0), values - top)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=axis, keepdims=True)


def sigmoid(values: np.ndarray) -> np.ndarray:
    """1 / (1 + e^-x) in FP32, without overflow for large |x|."""
    small = np.exp(-np.abs(values))
    return np.where(values >= 0, 1 / (1 + small), small / (1 + small)).astype(np.float32)


@dataclass
class Softmax:
    input: str
    output: str
    name: str = "softmax"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        return {**tensors, self.output: softmax(numbers(tensors, self.input, self.name))}


@dataclass
class Sigmoid:
    input: str
    output: str
    name: str = "sigmoid"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        return {**tensors, self.output: sigmoid(numbers(tensors, self.input, self.name))}


@dataclass
class Threshold:
    """BOOL: score >= threshold (one for all, or one per class on the last axis); NaN is False."""

    input: str
    output: str
    threshold: np.ndarray
    name: str = "threshold"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        scores = numbers(tensors, self.input, self.name)
        if self.threshold.ndim and (scores.ndim == 0 or scores.shape[-1] != self.threshold.size):
            raise Misconfigured(
                f"threshold has {self.threshold.size} per-class values but {self.input!r} "
                f"has shape {list(scores.shape)}"
            )
        return {**tensors, self.output: scores >= self.threshold}


@dataclass
class Sort:
    """Scores ordered along the last axis, with their class indices (INT64); NaN goes last."""

    input: str
    values: str
    indices: str
    descending: bool = True
    k: int | None = None
    name: str = "sort"

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        scores = numbers(tensors, self.input, self.name)
        if scores.ndim == 0:
            raise InvalidArgument(f"{self.name} needs classes on a last axis of {self.input!r}")
        order = np.argsort(-scores if self.descending else scores, axis=-1, kind="stable")
        if self.k is not None:
            order = order[..., : self.k]
        top = np.take_along_axis(scores, order, axis=-1)
        return {**tensors, self.values: top, self.indices: order.astype(np.int64)}


@dataclass
class Labels:
    """Class indices to label names (BYTES, same shape)."""

    input: str
    output: str
    labels: Sequence[str]
    source: str = "inline labels"
    # A tensor whose last axis has one entry per class (the model's logits): checked against
    # the labels, so a model with more classes than labels is refused, not half-labelled.
    classes_of: str | None = None
    name: str = "labels"
    _table: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._table = np.array([label.encode() for label in self.labels], dtype=object)

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        indices = take(tensors, self.input, self.name)
        if self.classes_of is not None:
            width = take(tensors, self.classes_of, self.name).shape[-1]
            if width != len(self._table):
                raise Misconfigured(
                    f"{self.name}: {self.classes_of!r} has {width} classes but {self.source} "
                    f"has {len(self._table)} labels"
                )
        if indices.dtype.kind not in "iu":
            raise Misconfigured(
                f"{self.name} needs integer class indices in {self.input!r}, got {indices.dtype}"
            )
        if indices.size and (indices.min() < 0 or indices.max() >= len(self._table)):
            raise Misconfigured(
                f"class index {int(indices.max())} has no label: {self.source} has "
                f"{len(self._table)} labels, fewer than the model's outputs"
            )
        return {**tensors, self.output: self._table[indices]}


@RULES.register("softmax")
def _build_softmax(options: Mapping[str, Any], base_dir: Path) -> Softmax:
    return Softmax(input=options["input"], output=options.get("output", options["input"]))


@RULES.register("sigmoid")
def _build_sigmoid(options: Mapping[str, Any], base_dir: Path) -> Sigmoid:
    return Sigmoid(input=options["input"], output=options.get("output", options["input"]))


@RULES.register("threshold")
def _build_threshold(options: Mapping[str, Any], base_dir: Path) -> Threshold:
    raw = options.get("threshold", 0.5)
    values = np.asarray(raw, dtype=np.float32) if _numeric(raw) else None
    if values is None or values.ndim > 1 or values.size == 0:
        raise ValueError(f"threshold must be a number or a list of numbers, got {raw!r}")
    return Threshold(input=options["input"], output=options["output"], threshold=values)


def _numeric(raw: Any) -> bool:
    items = raw if isinstance(raw, list) else [raw]
    return all(isinstance(v, int | float) and not isinstance(v, bool) for v in items)


@RULES.register("sort")
def _build_sort(options: Mapping[str, Any], base_dir: Path) -> Sort:
    return Sort(
        input=options["input"],
        values=options.get("values", options["input"]),
        indices=options["indices"],
        descending=bool(options.get("descending", True)),
    )


@RULES.register("topk")
def _build_topk(options: Mapping[str, Any], base_dir: Path) -> Sort:
    k = options["k"]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"topk: k must be a positive integer, got {k!r}")
    return Sort(
        input=options["input"],
        values=options["values"],
        indices=options["indices"],
        k=k,
        name="topk",
    )


@RULES.register("labels")
def _build_labels(options: Mapping[str, Any], base_dir: Path) -> Labels:
    """Inline `labels`, or a `file` beside the model; `classes` is checked at start-up."""
    if ("labels" in options) == ("file" in options):
        raise ValueError("labels: give either 'labels' (a list) or 'file', not both or neither")
    if "file" in options:
        labels = load_list(base_dir / options["file"], "labels", key="labels")
        source = f"labels file {options['file']!r}"
    else:
        labels = options["labels"]
        if not isinstance(labels, list) or not all(isinstance(v, str) and v for v in labels):
            raise ValueError("labels: 'labels' must be a list of non-empty strings")
        if not labels:
            raise ValueError("labels: 'labels' must list at least one label (non-empty strings)")
        source = "the inline labels"
    classes = options.get("classes")
    if classes is not None and (isinstance(classes, bool) or not isinstance(classes, int)):
        raise ValueError(f"labels: classes must be an integer, got {classes!r}")
    if classes is not None and len(labels) < classes:
        raise ValueError(
            f"{source} has {len(labels)} labels, fewer than the model's {classes} classes"
        )
    return Labels(
        input=options["input"],
        output=options["output"],
        labels=labels,
        source=source,
        classes_of=options.get("classes_of"),
    )
