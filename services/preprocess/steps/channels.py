"""Per-channel work on image batches: layout (HWC <-> CHW) and mean/std normalisation."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from services.preprocess.steps.base import STEPS
from strata.config.preprocess import LayoutStep, NormalizeStep
from strata.plugins import StepError, take
from strata.wire.codec import Arrays


@STEPS.register("layout")
@dataclass
class Layout:
    """[batch, H, W, C] to [batch, C, H, W] (to: CHW) or back (to: HWC), contiguous."""

    options: LayoutStep

    def process(self, tensors: Arrays) -> Arrays:
        source, to = self.options.input, self.options.to
        images = take(tensors, source, self.options.kind)
        if images.ndim == 3:
            moved = images[:, None] if to == "CHW" else images[..., None]
        elif images.ndim == 4:
            order = (0, 3, 1, 2) if to == "CHW" else (0, 2, 3, 1)
            moved = np.ascontiguousarray(images.transpose(order))
        else:
            raise StepError(
                f"input {source!r}: expected images [batch, height, width(, channels)], "
                f"got shape {list(images.shape)}"
            )
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: moved}


@STEPS.register("normalize")
@dataclass
class Normalize:
    """(x * scale - mean) / std per channel, as one multiply-add in FP32."""

    options: NormalizeStep
    _gain: np.ndarray = field(init=False, repr=False)
    _bias: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        std = np.asarray(self.options.std, dtype=np.float64)
        self._gain = (self.options.scale / std).astype(np.float32)
        self._bias = (-np.asarray(self.options.mean, dtype=np.float64) / std).astype(np.float32)

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        images = take(tensors, source, self.options.kind)
        if images.dtype.kind not in "biuf" or images.ndim < 3:
            raise StepError(
                f"input {source!r}: normalize needs numeric images [batch, ...], got "
                f"{images.dtype} {list(images.shape)}"
            )
        gain, bias = self._per_channel(images.shape)
        out = np.multiply(images, gain, dtype=np.float32)
        out += bias
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: out}

    def _per_channel(self, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Gain and bias shaped to broadcast along the channel axis."""
        layout = self.options.layout
        axis = 1 if layout == "CHW" else len(shape) - 1
        channels = shape[axis] if len(shape) == 4 else 1
        if len(self._gain) not in (1, channels):
            raise StepError(
                f"input {self.options.input!r}: {len(self._gain)} means and stds for "
                f"{channels} channels (layout {layout}, shape {list(shape)})"
            )
        where = [1] * len(shape)
        where[axis] = len(self._gain) if len(shape) == 4 else 1
        return self._gain.reshape(where), self._bias.reshape(where)
