"""The image workload's steps as a user would write them, with Pillow and numpy alone.

Imported by the project's benchmarks (bench.images' reference, the in-process loop) and by
the peers' runtimes, which run in venvs of their own (MLServer's: bench/peers/mlserver_images.py),
so it imports nothing but Pillow and numpy. decode -> resize (shorter side 256, bilinear) ->
centre crop 224 -> /255, ImageNet normalise -> CHW, as torchvision's Resize, CenterCrop,
ToTensor and Normalize do; after the model, softmax and the top 5.
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
SHORTER, CROP, TOP = 256, 224, 5


def reference(data: bytes) -> np.ndarray:
    """One JPEG's FP32 [3, 224, 224]."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(SHORTER * long / short)
    size = (new_long, SHORTER) if height <= width else (SHORTER, new_long)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - CROP) / 2.0), round((size[1] - CROP) / 2.0)
    image = image.crop((left, top, left + CROP, top + CROP))
    pixels = np.asarray(image, dtype=np.float32) / 255
    normalised = (pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return np.ascontiguousarray(normalised.transpose(2, 0, 1))


def top5(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's softmax: its 5 highest probabilities (FP32) and their classes (INT64)."""
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities = shifted / shifted.sum(axis=1, keepdims=True)
    classes = np.argsort(-probabilities, axis=1, kind="stable")[:, :TOP]
    return np.take_along_axis(probabilities, classes, axis=1), classes.astype(np.int64)
