"""Numeric steps: scale and cast, clip, flatten, standardise by dataset statistics."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from services.preprocess.stats import Stats, load_stats
from services.preprocess.steps.base import STEPS, StepError, Tensors, take


@dataclass
class Scale:
    """`x * factor + offset`, cast to FP32."""

    input: str
    factor: float = 1.0
    offset: float = 0.0
    name: str = "scale"

    def process(self, tensors: Tensors) -> Tensors:
        values = take(tensors, self.input, self.name).astype(np.float32)
        return {**tensors, self.input: values * np.float32(self.factor) + np.float32(self.offset)}


@dataclass
class Clip:
    """Clamp values into [low, high]."""

    input: str
    low: float
    high: float
    name: str = "clip"

    def process(self, tensors: Tensors) -> Tensors:
        values = take(tensors, self.input, self.name)
        return {**tensors, self.input: np.clip(values, self.low, self.high)}


@dataclass
class Flatten:
    """Flatten every dimension after the batch into one, renaming the tensor if asked."""

    input: str
    output: str
    name: str = "flatten"

    def process(self, tensors: Tensors) -> Tensors:
        values = take(tensors, self.input, self.name)
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: values.reshape(values.shape[0], -1)}


@dataclass
class Standardize:
    """`(x - mean) / std` per feature, with statistics loaded once from a stats file."""

    input: str
    stats: Stats
    name: str = "standardize"

    def process(self, tensors: Tensors) -> Tensors:
        values = take(tensors, self.input, self.name)
        features = self.stats.mean.shape[0]
        if values.ndim != 2 or values.shape[1] != features:
            raise StepError(
                f"input {self.input!r}: expected [batch, {features}] features, "
                f"got shape {list(values.shape)}"
            )
        standard = (values.astype(np.float32) - self.stats.mean) / self.stats.std
        return {**tensors, self.input: standard}


@STEPS.register("scale")
def _build_scale(options: Mapping[str, Any], base_dir: Path) -> Scale:
    return Scale(
        input=options["input"],
        factor=float(options.get("factor", 1.0)),
        offset=float(options.get("offset", 0.0)),
    )


@STEPS.register("clip")
def _build_clip(options: Mapping[str, Any], base_dir: Path) -> Clip:
    return Clip(input=options["input"], low=float(options["low"]), high=float(options["high"]))


@STEPS.register("flatten")
def _build_flatten(options: Mapping[str, Any], base_dir: Path) -> Flatten:
    return Flatten(input=options["input"], output=options.get("output", options["input"]))


@STEPS.register("standardize")
def _build_standardize(options: Mapping[str, Any], base_dir: Path) -> Standardize:
    """Stats must match `fingerprint`, or the `preprocess_fingerprint` in `model_yaml`."""
    stats = load_stats(base_dir / options["stats"])
    expected = options.get("fingerprint")
    if "model_yaml" in options:
        model_yaml = yaml.safe_load((base_dir / options["model_yaml"]).read_text()) or {}
        expected = model_yaml.get("preprocess_fingerprint")
        if expected is None:
            raise ValueError(f"{options['model_yaml']} records no preprocess_fingerprint")
    if expected is not None and expected != stats.fingerprint:
        raise ValueError(
            f"stats {options['stats']!r} have fingerprint {stats.fingerprint}, "
            f"but the model was built with {expected}"
        )
    return Standardize(input=options["input"], stats=stats)
