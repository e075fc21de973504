"""Image geometry over a batch: resize (Pillow's antialiased filters), crop and pad.

Layouts are [batch, H, W] or [batch, H, W, C], or a ragged batch of images of different sizes
(steps/ragged.py), which each step takes row by row as it is. Resize runs Pillow's C
resampler image by image (the loop is per row, the pixels never pass through Python): UINT8
grayscale and RGB go through Pillow's 8-bit path, rounded as Pillow and torchvision round;
other types and channel counts are resized channel by channel in 32-bit float, unrounded.
UINT8 images stay UINT8 (other channel counts rounded back), so that a crop of them crosses
the hops at a quarter of FP32's size (strata/shapes/folding.py); other types become FP32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from PIL import Image

from services.preprocess.steps.base import STEPS
from services.preprocess.steps.ragged import is_ragged, per_row
from strata.config.preprocess import CropStep, PadStep, ResizeStep
from strata.plugins import StepError, take
from strata.wire.codec import Arrays

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
    """Resize [batch, H, W] or [batch, H, W, C] images to [batch, height, width(, C)]: UINT8
    for UINT8 images, float32 for the others."""
    size = (images.shape[0], height, width, *images.shape[3:])
    channels = images.shape[3] if images.ndim == 4 else None
    if images.dtype == np.uint8 and channels in _EIGHT_BIT:
        mode = _EIGHT_BIT[channels]
        eight = np.empty(size, dtype=np.uint8)
        for row, image in zip(eight, images, strict=True):
            row[...] = _resize(Image.fromarray(image, mode), height, width, interpolation)
        return eight
    out = np.empty(size, dtype=np.float32)
    planes = images if channels is not None else images[..., None]
    target = out if channels is not None else out[..., None]
    for row, image in zip(target, planes, strict=True):
        for channel in range(image.shape[2]):
            plane = Image.fromarray(image[..., channel].astype(np.float32), "F")
            row[..., channel] = _resize(plane, height, width, interpolation)
    if images.dtype == np.uint8:
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)
    return out


def _resize(image: Image.Image, height: int, width: int, interpolation: str) -> np.ndarray:
    return np.asarray(image.resize((width, height), FILTERS[interpolation]))


@STEPS.register("resize")
@dataclass
class Resize:
    """Resize images to a fixed size, or their shorter side to `shorter`; UINT8 stays UINT8,
    other types become FP32."""

    options: ResizeStep
    # Set by the pipeline where the decode before it resizes and crops every image it makes
    # (ResizeAhead with a crop): what this step then finds is done.
    done_in_decode: bool = field(default=False, init=False)
    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        if self.done_in_decode:
            return tensors
        source = self.options.input
        images = take(tensors, source, self.options.kind)
        resized = per_row(images, self._resize) if is_ragged(images) else self._resize(images)
        return {**tensors, source: resized}

    def _resize(self, images: np.ndarray) -> np.ndarray:
        check_images(images, self.options.input, "resize")
        height, width = self._size(*images.shape[1:3])
        if images.shape[1:3] == (height, width):
            return images if images.dtype == np.uint8 else images.astype(np.float32)
        return resize_images(images, height, width, self.options.interpolation)

    def _size(self, height: int, width: int) -> tuple[int, int]:
        options = self.options
        if options.shorter is not None:
            return shorter_side_size(height, width, options.shorter)
        assert options.height is not None and options.width is not None  # the options ensure it
        return options.height, options.width


@STEPS.register("crop")
@dataclass
class Crop:
    """A height x width window: at top/left, or centred (as torchvision's CenterCrop)."""

    options: CropStep
    # Set by the pipeline where the decode before it crops every image it makes (ResizeAhead).
    done_in_decode: bool = field(default=False, init=False)
    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        images = take(tensors, source, self.options.kind)
        if not self.done_in_decode:
            images = per_row(images, self._crop) if is_ragged(images) else self._crop(images)
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: images}

    def _crop(self, images: np.ndarray) -> np.ndarray:
        height, width = self.options.height, self.options.width
        check_images(images, self.options.input, "crop")
        top, left = self._corner(*images.shape[1:3])
        return np.ascontiguousarray(images[:, top : top + height, left : left + width])

    def _corner(self, height: int, width: int) -> tuple[int, int]:
        box = self.options
        if box.top is None or box.left is None:
            top = round((height - box.height) / 2.0)
            left = round((width - box.width) / 2.0)
        else:
            top, left = box.top, box.left
        if top < 0 or left < 0 or top + box.height > height or left + box.width > width:
            raise StepError(
                f"input {box.input!r}: a {box.width}x{box.height} crop at left {left}, "
                f"top {top} does not fit images of {width}x{height}; resize or pad them first"
            )
        return top, left


@dataclass(frozen=True)
class ResizeAhead:
    """A resize, and the crop after it where one follows on the same images, run by the
    decode before them on each image while its pixels are still in Pillow: that spares an
    image the round trip through numpy between the steps (Pillow keeps RGB as 4 bytes a
    pixel, so each way is a repack). With a crop, Pillow resizes only the crop's window (its
    `box`), 50-60% of the cost of resizing the whole image: the same filter at the same
    centres, whose coordinates, counted from the window's corner instead of the image's,
    round a few values one level the other way (24 of 150,528 for a 640x480 photo to 224,
    bilinear; 0.3% at most in the tests; none for area). Without a crop the resize step
    finds the images at its size and passes them on; with one the decode brings every image
    the rest of the way (`pixels`), and the resize and the crop step pass everything on
    (`done_in_decode`)."""

    resize: Resize
    crop: Crop | None = None

    def image(self, image: Image.Image) -> Image.Image | None:
        """`image` resized (and cropped) in Pillow; None for a mode its 8-bit path does not
        take alike (those go on as pixels)."""
        if image.mode not in _EIGHT_BIT.values():
            return None
        height, width = self.resize._size(image.height, image.width)
        resample = FILTERS[self.resize.options.interpolation]
        if self.crop is None:
            if (image.height, image.width) == (height, width):
                return image
            return image.resize((width, height), resample)
        top, left = self.crop._corner(height, width)
        out = (self.crop.options.width, self.crop.options.height)
        if (image.height, image.width) == (height, width):
            return image.crop((left, top, left + out[0], top + out[1]))
        across, down = image.width / width, image.height / height
        box = (left * across, top * down, (left + out[0]) * across, (top + out[1]) * down)
        return image.resize(out, resample, box=box)

    def pixels(self, images: np.ndarray) -> np.ndarray:
        """A batch of one size that did not pass through `image`: resized and cropped as the
        two steps would, where a crop is fused; else as it is, for the resize step."""
        if self.crop is None:
            return images
        return self.crop._crop(self.resize._resize(images))


@STEPS.register("pad")
@dataclass
class Pad:
    """Borders of a constant value around every image; the type is kept."""

    options: PadStep
    takes_ragged: ClassVar[bool] = True

    def process(self, tensors: Arrays) -> Arrays:
        pad = self.options
        images = take(tensors, pad.input, pad.kind)
        padded = per_row(images, self._pad) if is_ragged(images) else self._pad(images)
        rest = {k: v for k, v in tensors.items() if k != pad.input}
        return {**rest, pad.target: padded}

    def _pad(self, images: np.ndarray) -> np.ndarray:
        pad = self.options
        check_images(images, pad.input, "pad")
        if images.dtype.kind in "iu" and not _holds(images.dtype, pad.value):
            raise StepError(
                f"input {pad.input!r}: pad value {pad.value} does not fit {images.dtype} pixels"
            )
        widths = [(0, 0), (pad.top, pad.bottom), (pad.left, pad.right)]
        widths += [(0, 0)] * (images.ndim - 3)
        return np.pad(images, widths, constant_values=images.dtype.type(pad.value))


def _holds(dtype: np.dtype, value: float) -> bool:
    info = np.iinfo(dtype)
    return float(value).is_integer() and info.min <= value <= info.max
