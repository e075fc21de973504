"""Numeric steps: scale, clip, cast, flatten, standardise by dataset statistics."""

from __future__ import annotations

import math
from dataclasses import InitVar, dataclass, field
from pathlib import Path

import numpy as np

from services.preprocess.steps.base import STEPS
from strata import yamltext
from strata.config.preprocess import (
    VERSION,
    CastStep,
    ClipStep,
    FlattenStep,
    ScaleStep,
    StandardizeStep,
)
from strata.models.normalisation import Stats, load_stats
from strata.plugins import StepError, take
from strata.wire.codec import DTYPES, Arrays


@STEPS.register("scale")
@dataclass
class Scale:
    """`x * factor + offset`, cast to FP32."""

    options: ScaleStep

    def process(self, tensors: Arrays) -> Arrays:
        scale = self.options
        values = take(tensors, scale.input, scale.kind).astype(np.float32)
        scaled = values * np.float32(scale.factor) + np.float32(scale.offset)
        return {**tensors, scale.input: scaled}


@STEPS.register("clip")
@dataclass
class Clip:
    """Clamp values into [low, high] (either may be open); infinities go to the bounds.

    NaN has no place in a range: it becomes `nan` when that is set, and is refused otherwise.
    """

    options: ClipStep

    def process(self, tensors: Arrays) -> Arrays:
        clip = self.options
        values = take(tensors, clip.input, clip.kind)
        if values.dtype.kind == "f":
            clipped = self._clip_floats(values)
        elif values.dtype.kind in "iu":
            clipped = np.clip(values, *_integer_bounds(values.dtype, clip.low, clip.high))
        else:
            raise StepError(f"input {clip.input!r}: clip needs numbers, got {values.dtype}")
        return {**tensors, clip.input: clipped}

    def _clip_floats(self, values: np.ndarray) -> np.ndarray:
        clip = self.options
        low = -np.inf if clip.low is None else clip.low
        high = np.inf if clip.high is None else clip.high
        clipped: np.ndarray = np.clip(values, low, high).astype(values.dtype, copy=False)
        holes = np.isnan(clipped)
        if holes.any():
            if clip.nan is None:
                raise StepError(
                    f"input {clip.input!r}: contains NaN (clip replaces NaN only if 'nan' is set)"
                )
            clipped[holes] = clip.nan
        return clipped


def _integer_bounds(dtype: np.dtype, low: float | None, high: float | None) -> tuple[int, int]:
    """Float bounds as the integers of `dtype` inside them."""
    info = np.iinfo(dtype)
    lo = info.min if low is None else max(info.min, min(info.max, math.ceil(low)))
    hi = info.max if high is None else min(info.max, max(info.min, math.floor(high)))
    return lo, hi


@STEPS.register("cast")
@dataclass
class Cast:
    """Convert to another numeric datatype, refusing values the new type cannot hold."""

    options: CastStep

    def process(self, tensors: Arrays) -> Arrays:
        cast = self.options
        values = take(tensors, cast.input, cast.kind)
        if values.dtype.kind not in "biuf":
            raise StepError(f"input {cast.input!r}: cast needs numbers, got {values.dtype}")
        target = DTYPES[cast.datatype]
        if cast.round and values.dtype.kind == "f" and target.kind in "iu":
            values = np.rint(values)
        self._check_range(values, target)
        rest = {k: v for k, v in tensors.items() if k != cast.input}
        return {**rest, cast.target: values.astype(target)}

    def _check_range(self, values: np.ndarray, target: np.dtype) -> None:
        if target.kind == "b" or values.size == 0:
            return
        if target.kind == "f":
            problem = _float_overflow(values, target)
        else:
            problem = _int_misfit(values, target)
        if problem:
            raise StepError(f"input {self.options.input!r}: {problem} for {self.options.datatype}")


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


@STEPS.register("flatten")
@dataclass
class Flatten:
    """Flatten every dimension after the batch into one, renaming the tensor if asked."""

    options: FlattenStep

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        values = take(tensors, source, self.options.kind)
        rest = {k: v for k, v in tensors.items() if k != source}
        # An explicit width, since reshape cannot infer -1 for an empty batch.
        width = math.prod(values.shape[1:])
        return {**rest, self.options.target: values.reshape(values.shape[0], width)}


def recorded_fingerprint(base_dir: Path, model_yaml: str, version: str = "") -> str:
    """The `preprocess_fingerprint` a model.yaml records: its one for every version, or the
    one for `version` where it records one per version."""
    body = yamltext.safe_load((base_dir / model_yaml).read_text()) or {}
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


@STEPS.register("standardize", repository=True)
@dataclass
class Standardize:
    """`(x - mean) / std` per feature, with statistics loaded once from a stats file that
    must match `fingerprint`, or the `preprocess_fingerprint` in `model_yaml`."""

    options: StandardizeStep
    repository: InitVar[Path]
    stats: Stats = field(init=False)

    def __post_init__(self, repository: Path) -> None:
        options = self.options
        self.stats = load_stats(repository / options.stats)
        expected = options.fingerprint
        if options.model_yaml is not None:
            expected = recorded_fingerprint(repository, options.model_yaml)
        if expected is not None and expected != self.stats.fingerprint:
            raise ValueError(
                f"stats {options.stats!r} have fingerprint {self.stats.fingerprint}, "
                f"but the model was built with {expected}"
            )

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        values = take(tensors, source, self.options.kind)
        features = self.stats.mean.shape[0]
        if values.ndim != 2 or values.shape[1] != features:
            raise StepError(
                f"input {source!r}: expected [batch, {features}] features, "
                f"got shape {list(values.shape)}"
            )
        # In FP64, so that finite FP32 input cannot overflow on the way; the result must fit.
        with np.errstate(over="ignore", invalid="ignore"):
            wide = (values.astype(np.float64) - self.stats.mean) / self.stats.std
            standard = wide.astype(np.float32)
        if not np.isfinite(standard).all():
            row, feature = (int(i) for i in np.argwhere(~np.isfinite(standard))[0])
            raise StepError(
                f"input {source!r}: row {row} feature {feature} ({values[row, feature]!r}) "
                "is too far from the training data to standardise (the result is not a "
                "finite FP32 number)"
            )
        return {**tensors, source: standard}
