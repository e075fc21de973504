"""Numeric steps: scale, clip, cast, flatten, standardise by dataset statistics."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from services.preprocess.steps.base import STEPS
from strata.codec import DTYPES, Arrays
from strata.config.preprocess import (
    VERSION,
    CastStep,
    ClipStep,
    FlattenStep,
    ScaleStep,
    StandardizeStep,
)
from strata.normalisation import Stats, load_stats
from strata.plugins import StepError, take


@dataclass
class Scale:
    """`x * factor + offset`, cast to FP32."""

    input: str
    factor: float = 1.0
    offset: float = 0.0
    name: str = "scale"

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.input, self.name).astype(np.float32)
        return {**tensors, self.input: values * np.float32(self.factor) + np.float32(self.offset)}


@dataclass
class Clip:
    """Clamp values into [low, high] (either may be open); infinities go to the bounds.

    NaN has no place in a range: it becomes `nan` when that is set, and is refused otherwise.
    """

    input: str
    low: float | None
    high: float | None
    nan: float | None = None
    name: str = "clip"

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.input, self.name)
        if values.dtype.kind == "f":
            clipped = self._clip_floats(values)
        elif values.dtype.kind in "iu":
            clipped = np.clip(values, *_integer_bounds(values.dtype, self.low, self.high))
        else:
            raise StepError(f"input {self.input!r}: clip needs numbers, got {values.dtype}")
        return {**tensors, self.input: clipped}

    def _clip_floats(self, values: np.ndarray) -> np.ndarray:
        low = -np.inf if self.low is None else self.low
        high = np.inf if self.high is None else self.high
        clipped = np.clip(values, low, high).astype(values.dtype, copy=False)
        holes = np.isnan(clipped)
        if holes.any():
            if self.nan is None:
                raise StepError(
                    f"input {self.input!r}: contains NaN (clip replaces NaN only if 'nan' is set)"
                )
            clipped[holes] = self.nan
        return clipped


def _integer_bounds(dtype: np.dtype, low: float | None, high: float | None) -> tuple[int, int]:
    """Float bounds as the integers of `dtype` inside them."""
    info = np.iinfo(dtype)
    lo = info.min if low is None else max(info.min, min(info.max, math.ceil(low)))
    hi = info.max if high is None else min(info.max, max(info.min, math.floor(high)))
    return lo, hi


@dataclass
class Cast:
    """Convert to another numeric datatype, refusing values the new type cannot hold."""

    input: str
    output: str
    datatype: str
    round: bool = False
    name: str = "cast"

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.input, self.name)
        if values.dtype.kind not in "biuf":
            raise StepError(f"input {self.input!r}: cast needs numbers, got {values.dtype}")
        target = DTYPES[self.datatype]
        if self.round and values.dtype.kind == "f" and target.kind in "iu":
            values = np.rint(values)
        self._check_range(values, target)
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: values.astype(target)}

    def _check_range(self, values: np.ndarray, target: np.dtype) -> None:
        if target.kind == "b" or values.size == 0:
            return
        if target.kind == "f":
            problem = _float_overflow(values, target)
        else:
            problem = _int_misfit(values, target)
        if problem:
            raise StepError(f"input {self.input!r}: {problem} for {self.datatype}")


def _float_overflow(values: np.ndarray, target: np.dtype) -> str | None:
    """Finite values that would become infinite in a narrower float type."""
    finite = np.isfinite(values) if values.dtype.kind == "f" else True
    with np.errstate(over="ignore"):
        overflow = finite & ~np.isfinite(values.astype(target))
    return "a value is too large" if np.any(overflow) else None


def _int_misfit(values: np.ndarray, target: np.dtype) -> str | None:
    """Why `values` cannot become the integer type `target`, or None if they can."""
    info = np.iinfo(target)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all():
            return "NaN or infinity has no value"
        # Casting truncates; float(info.max) + 1 is an exact power of two, info.max is not.
        whole = np.trunc(values)
        low, high = whole.min(), whole.max()
        outside = low < info.min or high >= float(info.max) + 1
    else:
        low, high = values.min(), values.max()
        outside = int(low) < info.min or int(high) > info.max
    return f"values {low}..{high} are outside {info.min}..{info.max}" if outside else None


@dataclass
class Flatten:
    """Flatten every dimension after the batch into one, renaming the tensor if asked."""

    input: str
    output: str
    name: str = "flatten"

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.input, self.name)
        rest = {k: v for k, v in tensors.items() if k != self.input}
        # An explicit width, since reshape cannot infer -1 for an empty batch.
        width = math.prod(values.shape[1:])
        return {**rest, self.output: values.reshape(values.shape[0], width)}


@dataclass
class Standardize:
    """`(x - mean) / std` per feature, with statistics loaded once from a stats file."""

    input: str
    stats: Stats
    name: str = "standardize"

    def process(self, tensors: Arrays) -> Arrays:
        values = take(tensors, self.input, self.name)
        features = self.stats.mean.shape[0]
        if values.ndim != 2 or values.shape[1] != features:
            raise StepError(
                f"input {self.input!r}: expected [batch, {features}] features, "
                f"got shape {list(values.shape)}"
            )
        # In FP64, so that finite FP32 input cannot overflow on the way; the result must fit.
        with np.errstate(over="ignore", invalid="ignore"):
            wide = (values.astype(np.float64) - self.stats.mean) / self.stats.std
            standard = wide.astype(np.float32)
        if not np.isfinite(standard).all():
            row, feature = (int(i) for i in np.argwhere(~np.isfinite(standard))[0])
            raise StepError(
                f"input {self.input!r}: row {row} feature {feature} ({values[row, feature]!r}) "
                "is too far from the training data to standardise (the result is not a "
                "finite FP32 number)"
            )
        return {**tensors, self.input: standard}


@STEPS.register("scale")
def _build_scale(spec: ScaleStep, base_dir: Path) -> Scale:
    return Scale(input=spec.input, factor=spec.factor, offset=spec.offset)


@STEPS.register("clip")
def _build_clip(spec: ClipStep, base_dir: Path) -> Clip:
    return Clip(input=spec.input, low=spec.low, high=spec.high, nan=spec.nan)


@STEPS.register("cast")
def _build_cast(spec: CastStep, base_dir: Path) -> Cast:
    return Cast(
        input=spec.input,
        output=spec.output or spec.input,
        datatype=spec.datatype,
        round=spec.round,
    )


@STEPS.register("flatten")
def _build_flatten(spec: FlattenStep, base_dir: Path) -> Flatten:
    return Flatten(input=spec.input, output=spec.output or spec.input)


def recorded_fingerprint(base_dir: Path, model_yaml: str, version: str = "") -> str:
    """The `preprocess_fingerprint` a model.yaml records: its one for every version, or the
    one for `version` where it records one per version."""
    body = yaml.safe_load((base_dir / model_yaml).read_text()) or {}
    recorded = body.get("preprocess_fingerprint") if isinstance(body, dict) else None
    if isinstance(recorded, dict):
        if not version:
            raise ValueError(
                f"{model_yaml} records a preprocess_fingerprint per version: name the stats "
                f"per version ({VERSION} in the path)"
            )
        recorded = {str(v): p for v, p in recorded.items()}.get(version)
        if recorded is None:
            raise ValueError(
                f"{model_yaml} records no preprocess_fingerprint for version {version}"
            )
    if not isinstance(recorded, str):
        raise ValueError(f"{model_yaml} records no preprocess_fingerprint")
    return recorded


@STEPS.register("standardize")
def _build_standardize(spec: StandardizeStep, base_dir: Path) -> Standardize:
    """Stats must match `fingerprint`, or the `preprocess_fingerprint` in `model_yaml`."""
    stats = load_stats(base_dir / spec.stats)
    expected = spec.fingerprint
    if spec.model_yaml is not None:
        expected = recorded_fingerprint(base_dir, spec.model_yaml)
    if expected is not None and expected != stats.fingerprint:
        raise ValueError(
            f"stats {spec.stats!r} have fingerprint {stats.fingerprint}, "
            f"but the model was built with {expected}"
        )
    return Standardize(input=spec.input, stats=stats)
