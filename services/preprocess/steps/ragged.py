"""A batch of images of different sizes, as the per-row image steps pass it on.

A flight may carry a portrait and a landscape photo, and a pipeline that resizes the shorter
side and then crops makes them one size in the end. Until then, `decode`, `resize`, `crop`
and `pad` pass a ragged batch: a 1-D object array holding each row's own [H, W(, C)] pixels,
and each of them takes every row as it is. Once the rows agree in shape they are stacked
into one array again; a step that needs one (normalize, layout...) refuses a ragged batch,
naming the steps that would make it one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from strata.plugins import StepError


def is_ragged(values: np.ndarray) -> bool:
    """Whether `values` is a batch of images of different sizes (not a BYTES tensor)."""
    return (
        values.dtype == object
        and values.ndim == 1
        and len(values) > 0
        and isinstance(values[0], np.ndarray)
    )


def batch(images: Sequence[np.ndarray]) -> np.ndarray:
    """Rows of [H, W(, C)] pixels (at least one) as one stacked batch where they agree in
    shape and type, else a ragged one."""
    first = images[0]
    if all(image.shape == first.shape and image.dtype == first.dtype for image in images):
        return np.stack(images)
    ragged = np.empty(len(images), dtype=object)
    for index, image in enumerate(images):  # one by one: numpy would broadcast a list
        ragged[index] = image
    return ragged


def per_row(images: np.ndarray, step: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """`step` (on a [1, H, W(, C)] batch) over each row of a ragged batch, then batched."""
    return batch([step(image[None])[0] for image in images])


def refuse(name: str, step: str) -> StepError:
    return StepError(
        f"input {name!r}: {step} takes images of one size, and these differ; make them one "
        "size before it (decode's height and width, resize to a size, or crop)"
    )
