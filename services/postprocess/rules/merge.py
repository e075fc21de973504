"""Merging tensors: the weighted mean of models' outputs after a fan-out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from services.postprocess.rules.base import RULES
from strata.codec import Arrays
from strata.config.postprocess import MeanRule
from strata.errors import NotReady
from strata.plugins import RuleContext, numbers


@dataclass
class Mean:
    bounded: ClassVar[bool] = True

    sources: tuple[str, ...]
    weights: tuple[float, ...]
    output: str
    name: str = "mean"

    @property
    def inputs(self) -> tuple[str, ...]:
        return self.sources

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        arrays = [numbers(tensors, source, self.name) for source in self.sources]
        shapes = {source: list(a.shape) for source, a in zip(self.sources, arrays, strict=True)}
        if len({tuple(shape) for shape in shapes.values()}) != 1:
            # What models gave, not what the client sent: the pipeline's fault.
            raise NotReady(f"{self.name}: its inputs differ in shape: {shapes}")
        weights = np.asarray(self.weights, dtype=np.float32) / sum(self.weights)
        merged = np.tensordot(weights, np.stack(arrays), axes=1).astype(np.float32)
        return {**tensors, self.output: merged}


@RULES.register("mean")
def _build_mean(spec: MeanRule, base_dir: Path) -> Mean:
    weights = tuple(spec.weights) if spec.weights else (1.0,) * len(spec.inputs)
    return Mean(sources=tuple(spec.inputs), weights=weights, output=spec.output)
