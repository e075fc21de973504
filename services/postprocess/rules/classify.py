"""Classification rules: softmax, sigmoid, threshold, sort, top-k, and label mapping."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np

from services.postprocess.rules.base import RULES, Misconfigured, load_list
from strata.codec import Arrays
from strata.config.postprocess import (
    LabelsRule,
    SigmoidRule,
    SoftmaxRule,
    SortRule,
    ThresholdRule,
    TopkRule,
)
from strata.errors import InvalidArgument
from strata.plugins import RuleContext, numbers, take


def softmax(logits: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax in FP32 (the rules refuse NaN and infinities before it).

    A row with +inf shares its probability among its +inf entries; a row of only -inf is
    uniform; NaN makes its row NaN.
    """
    values = logits.astype(np.float32, copy=False)
    if values.ndim == 0 or values.shape[axis] == 0:
        raise InvalidArgument(
            f"softmax needs at least one class along the last axis, got shape {list(values.shape)}"
        )
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
    bounded: ClassVar[bool] = True

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
    bounded: ClassVar[bool] = True

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

    bounded: ClassVar[bool] = True

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

    bounded: ClassVar[bool] = True

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

    bounded: ClassVar[bool] = True

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
def _build_softmax(spec: SoftmaxRule, base_dir: Path) -> Softmax:
    return Softmax(input=spec.input, output=spec.output or spec.input)


@RULES.register("sigmoid")
def _build_sigmoid(spec: SigmoidRule, base_dir: Path) -> Sigmoid:
    return Sigmoid(input=spec.input, output=spec.output or spec.input)


@RULES.register("threshold")
def _build_threshold(spec: ThresholdRule, base_dir: Path) -> Threshold:
    threshold = np.asarray(spec.threshold, dtype=np.float32)
    return Threshold(input=spec.input, output=spec.output, threshold=threshold)


@RULES.register("sort")
def _build_sort(spec: SortRule, base_dir: Path) -> Sort:
    return Sort(
        input=spec.input,
        values=spec.values or spec.input,
        indices=spec.indices,
        descending=spec.descending,
    )


@RULES.register("topk")
def _build_topk(spec: TopkRule, base_dir: Path) -> Sort:
    return Sort(input=spec.input, values=spec.values, indices=spec.indices, k=spec.k, name="topk")


@RULES.register("labels")
def _build_labels(spec: LabelsRule, base_dir: Path) -> Labels:
    """Inline `labels`, or a `file` beside the model; `classes` is checked at start-up."""
    if spec.file is not None:
        labels = load_list(base_dir / spec.file, "labels", key="labels")
        source = f"labels file {spec.file!r}"
    else:
        labels = spec.labels or []
        source = "the inline labels"
    if spec.classes is not None and len(labels) < spec.classes:
        raise ValueError(
            f"{source} has {len(labels)} labels, fewer than the model's {spec.classes} classes"
        )
    return Labels(
        input=spec.input,
        output=spec.output,
        labels=labels,
        source=source,
        classes_of=spec.classes_of,
    )
