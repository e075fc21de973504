"""Resize a batch of grayscale or colour images with a stated interpolation."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.preprocess.steps.base import STEPS
from strata.codec import Arrays
from strata.config.preprocess import ResizeStep
from strata.plugins import StepError, take


def _source_coords(out_size: int, in_size: int) -> np.ndarray:
    """Half-pixel centre mapping, as OpenCV and Pillow use for resizing."""
    scale = in_size / out_size
    return np.clip((np.arange(out_size) + 0.5) * scale - 0.5, 0, in_size - 1)


def _area_matrix(out_size: int, in_size: int) -> np.ndarray:
    """Weights [out, in] averaging the input pixels each output pixel covers."""
    edges = np.arange(out_size + 1) * (in_size / out_size)
    left, right = edges[:-1, None], edges[1:, None]
    pixel = np.arange(in_size)[None, :]
    overlap = np.clip(np.minimum(right, pixel + 1) - np.maximum(left, pixel), 0, None)
    return overlap / overlap.sum(axis=1, keepdims=True)


def _linear_matrix(out_size: int, in_size: int) -> np.ndarray:
    """Weights [out, in] of linear interpolation between the two nearest input pixels."""
    coords = _source_coords(out_size, in_size)
    low = np.floor(coords).astype(int)
    high = np.minimum(low + 1, in_size - 1)
    frac = coords - low
    weights = np.zeros((out_size, in_size))
    rows = np.arange(out_size)
    np.add.at(weights, (rows, low), 1 - frac)
    np.add.at(weights, (rows, high), frac)
    return weights


def _nearest_matrix(out_size: int, in_size: int) -> np.ndarray:
    index = np.floor((np.arange(out_size) + 0.5) * in_size / out_size).astype(int)
    weights = np.zeros((out_size, in_size))
    weights[np.arange(out_size), np.minimum(index, in_size - 1)] = 1.0
    return weights


INTERPOLATIONS = {"area": _area_matrix, "bilinear": _linear_matrix, "nearest": _nearest_matrix}


@functools.lru_cache(maxsize=256)
def _weights(interpolation: str, out_size: int, in_size: int) -> np.ndarray:
    """The weights for one size pair, made once (read-only: every call shares them)."""
    weights = INTERPOLATIONS[interpolation](out_size, in_size)
    weights.setflags(write=False)
    return weights


def resize_images(images: np.ndarray, height: int, width: int, interpolation: str) -> np.ndarray:
    """Resize [batch, H, W] or [batch, H, W, C] images to float32 [batch, height, width(, C)].

    Separable interpolation as two matrix products over the whole batch at once.
    """
    rows = _weights(interpolation, height, images.shape[1])
    cols = _weights(interpolation, width, images.shape[2])
    data = images.astype(np.float64)
    out = np.einsum("oh,bhw...->bow...", rows, data)
    out = np.einsum("pw,bow...->bop...", cols, out)
    return out.astype(np.float32)


@dataclass
class Resize:
    """Resize images to a fixed size; the output is FP32 in the input's value range."""

    input: str
    height: int
    width: int
    interpolation: str = "area"
    name: str = "resize"

    def process(self, tensors: Arrays) -> Arrays:
        images = take(tensors, self.input, self.name)
        if images.dtype.kind not in "biuf":
            raise StepError(f"input {self.input!r}: resize needs pixel numbers, got {images.dtype}")
        if images.ndim not in (3, 4) or min(images.shape[1:3]) < 1:
            raise StepError(
                f"input {self.input!r}: expected images [batch, height, width(, channels)] "
                f"with positive sizes, got shape {list(images.shape)}"
            )
        resized = resize_images(images, self.height, self.width, self.interpolation)
        return {**tensors, self.input: resized}


@STEPS.register("resize")
def _build_resize(spec: ResizeStep, base_dir: Path) -> Resize:
    return Resize(
        input=spec.input, height=spec.height, width=spec.width, interpolation=spec.interpolation
    )
