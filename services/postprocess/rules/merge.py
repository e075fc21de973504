"""Merging tensors: the weighted mean of models' outputs after a fan-out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from services.postprocess.rules.base import RULES
from strata.config.postprocess import MeanRule
from strata.errors import NotReady
from strata.plugins import RuleContext, numbers
from strata.wire.codec import Arrays


@RULES.register("mean")
@dataclass
class Mean:
    bounded: ClassVar[bool] = True

    options: MeanRule
    _weights: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        weights = self.options.weights or [1.0] * len(self.options.inputs)
        self._weights = np.asarray(weights, dtype=np.float32) / sum(weights)

    @property
    def inputs(self) -> tuple[str, ...]:
        return tuple(self.options.inputs)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        sources, kind = self.options.inputs, self.options.kind
        arrays = [numbers(tensors, source, kind) for source in sources]
        shapes = {source: list(a.shape) for source, a in zip(sources, arrays, strict=True)}
        if len({tuple(shape) for shape in shapes.values()}) != 1:
            # What models gave, not what the client sent: the pipeline's fault.
            raise NotReady(f"{kind}: its inputs differ in shape: {shapes}")
        merged = np.tensordot(self._weights, np.stack(arrays), axes=1).astype(np.float32)
        return {**tensors, self.options.output: merged}
