"""Image decode: PNG and JPEG bytes (a BYTES tensor) or raw UINT8 arrays to one pixel batch.

Each encoded image's header is read before its pixels: an image over `max_pixels`, or one that
takes the request over `max_batch_pixels`, is refused before it is decompressed, so small files
that unpack into gigabytes (decompression bombs) cost nothing. Pixels end in one colour mode
(see color.py for the layouts); with `height` and `width` each is resized to that size, else
images of different sizes go on as a ragged batch (steps/ragged.py) for resize and crop to
make one size, each row as it is.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from PIL import ExifTags, Image, ImageOps, UnidentifiedImageError

from services.preprocess.steps.base import STEPS
from services.preprocess.steps.color import convert_pixels, mode_of
from services.preprocess.steps.image import ResizeAhead, resize_images
from services.preprocess.steps.ragged import batch
from strata.config.preprocess import DecodeStep
from strata.plugins import StepError, strings, take
from strata.wire.codec import Arrays

FORMATS = ("PNG", "JPEG")
# Pillow modes that map to ours without losing anything; 16-bit gray is shifted to 8 bits.
_NATIVE = {"L": "L", "RGB": "RGB", "RGBA": "RGBA"}
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I")
_ORIENTATION = ExifTags.Base.Orientation


@STEPS.register("decode")
@dataclass
class Decode:
    """PNG/JPEG bytes or UINT8 arrays to UINT8 images in `mode`, checked against limits."""

    options: DecodeStep
    _size: tuple[int, int] | None = field(init=False)
    # The resize (and crop) that follow on this step's output, run on each image before its
    # pixels leave Pillow; set by the pipeline (pipeline.py).
    ahead: ResizeAhead | None = field(default=None, init=False)
    takes_ragged: ClassVar[bool] = True

    def __post_init__(self) -> None:
        height, width = self.options.height, self.options.width
        self._size = None if height is None or width is None else (height, width)

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        values = take(tensors, source, self.options.kind)
        if values.dtype == object:
            images = self._decode_all(strings(tensors, source, self.options.kind))
        else:
            images = self._from_array(values)
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: images}

    def _from_array(self, values: np.ndarray) -> np.ndarray:
        mode_of(values, self.options.input)
        self._check_pixels(values.shape[1], values.shape[2], f"input {self.options.input!r}")
        converted = self._fit(self._convert(values))
        return converted if self.ahead is None else self.ahead.pixels(converted)

    def _convert(self, pixels: np.ndarray) -> np.ndarray:
        """UINT8 images in any mode to the step's `mode`."""
        options = self.options
        return convert_pixels(pixels, options.mode, options.input, options.background)

    def _decode_all(self, flat: np.ndarray) -> np.ndarray:
        images, total = [], 0
        for index, item in enumerate(flat):
            where = f"input {self.options.input!r}: element {index}"
            image = self._open(item, where)
            # Many small files can each unpack to max_pixels; bound the whole request too.
            total += image.width * image.height
            if total > self.options.max_batch_pixels:
                raise StepError(
                    f"{where} brings the request to {total} pixels, more than the "
                    f"{self.options.max_batch_pixels} allowed in all (decode's max_batch_pixels)"
                )
            images.append(self._fit(self._pixels(image, where)[None]))
        if not images:
            height, width = self._size or (0, 0)
            channels = () if self.options.mode == "L" else (len(self.options.mode),)
            return np.zeros((0, height, width, *channels), dtype=np.uint8)
        return images[0] if len(images) == 1 else batch([image[0] for image in images])

    def _open(self, item: object, where: str) -> Image.Image:
        """An encoded image with only its header read, checked against the limits."""
        data = bytes(item)  # type: ignore[call-overload]
        if len(data) > self.options.max_bytes:
            raise StepError(
                f"{where} is {len(data)} bytes, more than {self.options.max_bytes} (decode's "
                "max_bytes)"
            )
        try:
            image = Image.open(io.BytesIO(data), formats=FORMATS)
        except UnidentifiedImageError:
            raise StepError(f"{where} is not a PNG or JPEG image") from None
        except Image.DecompressionBombError as exc:
            # Pillow's own guard fires first for the most extreme sizes.
            limit = self.options.max_pixels
            raise StepError(
                f"{where}: {exc}; at most {limit} are allowed (decode's max_pixels)"
            ) from None
        except Exception as exc:  # Pillow's parsers raise many types on hostile headers
            raise StepError(f"{where} has a corrupt header ({exc})") from None
        self._check_pixels(image.height, image.width, where)
        return image

    def _pixels(self, image: Image.Image, where: str) -> np.ndarray:
        """Decompress an opened image to [H, W(, C)] pixels in `mode`."""
        try:
            image.load()
            if self.options.exif_orientation and image.getexif().get(_ORIENTATION, 1) != 1:
                image = ImageOps.exif_transpose(image)  # a copy: only when there is a turn
            early = self._early(image)
            pixels = _native_pixels(image if early is None else early)
        except StepError:  # the crop ahead does not fit: its own message
            raise
        except Exception as exc:  # likewise for the decoders (OSError, SyntaxError, zlib...)
            raise StepError(f"{where} is truncated or corrupt ({exc})") from None
        converted = self._convert(pixels[None])
        if self.ahead is not None and early is None:
            converted = self.ahead.pixels(converted)
        one: np.ndarray = converted[0]
        return one

    def _early(self, image: Image.Image) -> Image.Image | None:
        """`image` through the resize (and crop) ahead while in Pillow, if it can go."""
        if self.ahead is None or image.mode != self.options.mode:
            return None
        return self.ahead.image(image)

    def _check_pixels(self, height: int, width: int, where: str) -> None:
        if height * width > self.options.max_pixels:
            raise StepError(
                f"{where}: {width}x{height} is {height * width} pixels, more than the "
                f"{self.options.max_pixels} allowed (decode's max_pixels)"
            )

    def _fit(self, pixels: np.ndarray) -> np.ndarray:
        """Resize a batch to `size` if one is set, back to rounded UINT8."""
        if self._size is None or pixels.shape[1:3] == self._size:
            return pixels
        resized = resize_images(pixels, *self._size, self.options.interpolation)
        rounded: np.ndarray = np.clip(np.rint(resized), 0, 255).astype(np.uint8)
        return rounded


def _native_pixels(image: Image.Image) -> np.ndarray:
    """Pixels as L, RGB or RGBA without losing transparency; Pillow converts other modes."""
    if image.mode in _NATIVE:
        return np.asarray(image)
    if image.mode in _SIXTEEN_BIT:
        wide = np.asarray(image).astype(np.int64)
        return (np.clip(wide, 0, 65535) >> 8).astype(np.uint8)
    transparent = "A" in image.mode or "transparency" in image.info
    return np.asarray(image.convert("RGBA" if transparent else "RGB"))
