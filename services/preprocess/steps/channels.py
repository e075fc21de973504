"""Per-channel work on image batches: layout (HWC <-> CHW) and mean/std normalisation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from services.preprocess.steps.base import STEPS
from strata.codec import Arrays
from strata.config.preprocess import LayoutStep, NormalizeStep
from strata.plugins import StepError, take


@dataclass
class Layout:
    """[batch, H, W, C] to [batch, C, H, W] (to: CHW) or back (to: HWC), contiguous."""

    input: str
    output: str
    to: str
    name: str = "layout"

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        if images.ndim == 3:
            moved = images[:, None] if self.to == "CHW" else images[..., None]
        elif images.ndim == 4:
            order = (0, 3, 1, 2) if self.to == "CHW" else (0, 2, 3, 1)
            moved = np.ascontiguousarray(images.transpose(order))
        else:
            raise StepError(
                f"input {self.input!r}: expected images [batch, height, width(, channels)], "
                f"got shape {list(images.shape)}"
            )
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: moved}


@dataclass
class Normalize:
    """(x * scale - mean) / std per channel, as one multiply-add in FP32."""

    input: str
    output: str
    mean: list[float]
    std: list[float]
    scale: float = 1.0
    layout: str = "HWC"
    name: str = "normalize"
    _gain: np.ndarray = field(init=False, repr=False)
    _bias: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        std = np.asarray(self.std, dtype=np.float64)
        self._gain = (self.scale / std).astype(np.float32)
        self._bias = (-np.asarray(self.mean, dtype=np.float64) / std).astype(np.float32)

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        if images.dtype.kind not in "biuf" or images.ndim < 3:
            raise StepError(
                f"input {self.input!r}: normalize needs numeric images [batch, ...], got "
                f"{images.dtype} {list(images.shape)}"
            )
        gain, bias = self._per_channel(images.shape)
        out = np.multiply(images, gain, dtype=np.float32)
        out += bias
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: out}

    def _per_channel(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Gain and bias shaped to broadcast along the channel axis."""
        axis = 1 if self.layout == "CHW" else len(shape) - 1
        channels = shape[axis] if len(shape) == 4 else 1
        if len(self._gain) not in (1, channels):
            raise StepError(
                f"input {self.input!r}: {len(self._gain)} means and stds for {channels} "
                f"channels (layout {self.layout}, shape {list(shape)})"
            )
        where = [1] * len(shape)
        where[axis] = len(self._gain) if len(shape) == 4 else 1
        return self._gain.reshape(where), self._bias.reshape(where)


@STEPS.register("layout")
def _build_layout(spec: LayoutStep, base_dir: Path) -> Layout:
    return Layout(input=spec.input, output=spec.output or spec.input, to=spec.to)


@STEPS.register("normalize")
def _build_normalize(spec: NormalizeStep, base_dir: Path) -> Normalize:
    return Normalize(
        input=spec.input,
        output=spec.output or spec.input,
        mean=list(spec.mean),
        std=list(spec.std),
        scale=spec.scale,
        layout=spec.layout,
    )
