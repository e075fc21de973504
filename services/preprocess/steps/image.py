"""Image geometry over a batch: resize (Pillow's antialiased filters), crop and pad.

Layouts are [batch, H, W] or [batch, H, W, C], or a ragged batch of images of different sizes
(steps/ragged.py), which each step takes row by row as it is. Resize runs Pillow's C
resampler image by image (the loop is per row, the pixels never pass through Python): UINT8
grayscale and RGB go through Pillow's 8-bit path, rounded as Pillow and torchvision round;
other types and channel counts are resized channel by channel in 32-bit float, unrounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
from PIL import Image

from services.preprocess.steps.base import STEPS
from services.preprocess.steps.ragged import is_ragged, per_row
from strata.codec import Arrays
from strata.config.preprocess import CropStep, PadStep, ResizeStep
from strata.plugins import StepError, take

FILTERS = {
    "area": Image.Resampling.BOX,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "nearest": Image.Resampling.NEAREST,
}
# Channel counts Pillow resizes whole in its 8-bit path (RGBA would be premultiplied).
_EIGHT_BIT = {None: "L", 3: "RGB"}


def check_images(images: np.ndarray, name: str, step: str) -> None:
    """StepError unless `images` is a numeric [batch, H, W(, C)] batch of positive size."""
    if images.dtype.kind not in "biuf":
        raise StepError(f"input {name!r}: {step} needs pixel numbers, got {images.dtype}")
    if images.ndim not in (3, 4) or min(images.shape[1:3]) < 1:
        raise StepError(
            f"input {name!r}: expected images [batch, height, width(, channels)] "
            f"with positive sizes, got shape {list(images.shape)}"
        )


def shorter_side_size(height: int, width: int, shorter: int) -> tuple[int, int]:
    """The size whose shorter side is `shorter`, aspect kept (rounded down, as torchvision)."""
    if height <= width:
        return shorter, max(1, int(shorter * width / height))
    return max(1, int(shorter * height / width)), shorter


def resize_images(images: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    """Resize [batch, H, W] or [batch, H, W, C] images to float32 [batch, height, width(, C)]."""
    out = np.empty((images.shape[0], height, width, *images.shape[3:]), dtype=np.float32)
    channels = images.shape[3] if images.ndim == 4 else None
    if images.dtype == np.uint8 and channels in _EIGHT_BIT:
        mode = _EIGHT_BIT[channels]
        for row, image in zip(out, images, strict=True):
            row[...] = _resize(Image.fromarray(image, mode), height, width, interpolation)
        return out
    planes = images if channels is not None else images[..., None]
    target = out if channels is not None else out[..., None]
    for row, image in zip(target, planes, strict=True):
        for channel in range(image.shape[2]):
            plane = Image.fromarray(image[..., channel].astype(np.float32), "F")
            row[..., channel] = _resize(plane, height, width, interpolation)
    return out


def _resize(image: Image.Image, height: int, width: int, interpolation: str) -> np.ndarray:
    return np.asarray(image.resize((width, height), FILTERS[interpolation]))


@dataclass
class Resize:
    """Resize images to a fixed size, or their shorter side to `shorter`; FP32 out."""

    input: str
    height: int | None
    width: int | None
    interpolation: str = "area"
    shorter: int | None = None
    name: str = "resize"

    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        resized = per_row(images, self._resize) if is_ragged(images) else self._resize(images)
        return {**tensors, self.input: resized}

    def _resize(self, images: np.ndarray) -> np.ndarray:
        check_images(images, self.input, "resize")
        height, width = self._size(*images.shape[1:3])
        if images.shape[1:3] == (height, width):
            return images.astype(np.float32)
        return resize_images(images, height, width, self.interpolation)

    def _size(self, height: int, width: int) -> tuple[int, int]:
        if self.shorter is not None:
            return shorter_side_size(height, width, self.shorter)
        assert self.height is not None and self.width is not None  # the options ensure it
        return self.height, self.width


@dataclass
class Crop:
    """A height x width window: at top/left, or centred (as torchvision's CenterCrop)."""

    input: str
    output: str
    height: int
    width: int
    top: int | None = None
    left: int | None = None
    name: str = "crop"

    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        cropped = per_row(images, self._crop) if is_ragged(images) else self._crop(images)
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: cropped}

    def _crop(self, images: np.ndarray) -> np.ndarray:
        check_images(images, self.input, "crop")
        top, left = self._corner(*images.shape[1:3])
        cropped = images[:, top : top + self.height, left : left + self.width]
        return np.ascontiguousarray(cropped)

    def _corner(self, height: int, width: int) -> tuple[int, int]:
        if self.top is None or self.left is None:
            top = round((height - self.height) / 2.0)
            left = round((width - self.width) / 2.0)
        else:
            top, left = self.top, self.left
        if top < 0 or left < 0 or top + self.height > height or left + self.width > width:
            raise StepError(
                f"input {self.input!r}: a {self.width}x{self.height} crop at left {left}, "
                f"top {top} does not fit images of {width}x{height}; resize or pad them first"
            )
        return top, left


@dataclass
class Pad:
    """Borders of a constant value around every image; the type is kept."""

    input: str
    output: str
    top: int = 0
    bottom: int = 0
    left: int = 0
    right: int = 0
    value: float = 0.0
    name: str = "pad"

    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        padded = per_row(images, self._pad) if is_ragged(images) else self._pad(images)
        rest = {k: v for k, v in tensors.items() if k != self.input}
        return {**rest, self.output: padded}

    def _pad(self, images: np.ndarray) -> np.ndarray:
        check_images(images, self.input, "pad")
        if images.dtype.kind in "iu" and not _holds(images.dtype, self.value):
            raise StepError(
                f"input {self.input!r}: pad value {self.value} does not fit {images.dtype} pixels"
            )
        widths = [(0, 0), (self.top, self.bottom), (self.left, self.right)]
        widths += [(0, 0)] * (images.ndim - 3)
        return np.pad(images, widths, constant_values=images.dtype.type(self.value))


def _holds(dtype: np.dtype, value: float) -> bool:
    info = np.iinfo(dtype)
    return float(value).is_integer() and info.min <= value <= info.max


@STEPS.register("resize")
def _build_resize(spec: ResizeStep, base_dir: Path) -> Resize:
    return Resize(
        input=spec.input,
        height=spec.height,
        width=spec.width,
        interpolation=spec.interpolation,
        shorter=spec.shorter,
    )


@STEPS.register("crop")
def _build_crop(spec: CropStep, base_dir: Path) -> Crop:
    return Crop(
        input=spec.input,
        output=spec.output or spec.input,
        height=spec.height,
        width=spec.width,
        top=spec.top,
        left=spec.left,
    )


@STEPS.register("pad")
def _build_pad(spec: PadStep, base_dir: Path) -> Pad:
    return Pad(
        input=spec.input,
        output=spec.output or spec.input,
        top=spec.top,
        bottom=spec.bottom,
        left=spec.left,
        right=spec.right,
        value=spec.value,
    )
