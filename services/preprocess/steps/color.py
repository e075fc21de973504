"""Colour conversion of UINT8 image batches between grayscale, RGB, RGBA and BGR.

Layouts: grayscale is [batch, H, W] (or [batch, H, W, 1] on input), RGB [batch, H, W, 3],
RGBA [batch, H, W, 4]; BGR is an output only (three channels in are read as RGB). Grayscale
uses Pillow's integer ITU-R 601-2 luma, so an image sent raw and the same image sent as a PNG
become the same pixels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.preprocess.steps.base import STEPS
from strata.config.preprocess import ColorStep
from strata.plugins import StepError, take
from strata.wire.codec import Arrays

_CHANNELS = {1: "L", 3: "RGB", 4: "RGBA"}
# Pillow's L = (R*19595 + G*38470 + B*7471 + 0x8000) >> 16.
_LUMA = np.array([19595, 38470, 7471], dtype=np.uint32)


def mode_of(images: np.ndarray, name: str) -> str:
    """The colour mode an image batch's layout implies, or StepError."""
    if images.ndim == 3:
        return "L"
    if images.ndim == 4 and images.shape[3] in _CHANNELS:
        return _CHANNELS[images.shape[3]]
    raise StepError(
        f"input {name!r}: expected images [batch, height, width] or [batch, height, width, "
        f"1|3|4], got shape {list(images.shape)}"
    )


def convert_pixels(
    images: np.ndarray, mode: str, name: str, background: int | Sequence[int] | None = None
) -> np.ndarray:
    """UINT8 images in any of the three modes, converted to `mode` (or to BGR)."""
    if mode == "BGR":
        return np.ascontiguousarray(convert_pixels(images, "RGB", name, background)[..., ::-1])
    if images.dtype != np.uint8:
        raise StepError(f"input {name!r}: images must be UINT8 pixels, got {images.dtype}")
    source = mode_of(images, name)
    if source == "L":
        gray = images.reshape(images.shape[:3])
        return _from_gray(gray, mode)
    rgb = images[..., :3]
    if source == "RGBA" and mode != "RGBA" and background is not None:
        rgb = _composite(images, background)
    if mode == "L":
        return _luma(rgb)
    if mode == "RGB":
        return np.ascontiguousarray(rgb)
    return images if source == "RGBA" else _with_alpha(rgb)


def _from_gray(gray: np.ndarray, mode: str) -> np.ndarray:
    if mode == "L":
        return gray
    rgb = np.repeat(gray[..., None], 3, axis=3)
    return rgb if mode == "RGB" else _with_alpha(rgb)


def _luma(rgb: np.ndarray) -> np.ndarray:
    weighted = rgb.astype(np.uint32) @ _LUMA + 0x8000
    return (weighted >> 16).astype(np.uint8)


def _with_alpha(rgb: np.ndarray) -> np.ndarray:
    opaque = np.full((*rgb.shape[:3], 1), 255, dtype=np.uint8)
    return np.concatenate([rgb, opaque], axis=3)


def _composite(rgba: np.ndarray, background: int | Sequence[int]) -> np.ndarray:
    """RGBA over an opaque background colour (a gray level is all three channels), rounded
    to the nearest integer."""
    alpha = rgba[..., 3:].astype(np.uint32)
    colour = rgba[..., :3].astype(np.uint32)
    under = np.asarray(background, dtype=np.uint32)
    return ((colour * alpha + under * (255 - alpha) + 127) // 255).astype(np.uint8)


@STEPS.register("color")
@dataclass
class ColorConvert:
    """Convert an image batch to grayscale, RGB or RGBA."""

    options: ColorStep

    def process(self, tensors: Arrays) -> Arrays:
        source = self.options.input
        images = take(tensors, source, self.options.kind)
        converted = convert_pixels(images, self.options.mode, source, self.options.background)
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: converted}
