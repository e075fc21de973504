"""A decode followed by a resize of what it decoded resizes each image while it is still in
Pillow: the pixels are those of the two steps run one after the other, and they leave the
decode already at the resize's size."""

import io
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from bench.images import photo_jpeg
from services.preprocess.pipeline import PreprocessPipeline
from services.preprocess.steps import build_step_options
from strata.wire.codec import Arrays

LANDSCAPE = photo_jpeg(640, 480)
PORTRAIT = photo_jpeg(480, 640)


def encoded(image: Image.Image, form: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, form, **options)
    return buffer.getvalue()


def turned() -> bytes:
    """A JPEG whose EXIF says it is turned a quarter (orientation 6)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return encoded(Image.open(io.BytesIO(LANDSCAPE)), "JPEG", exif=exif)


GRAY = encoded(Image.open(io.BytesIO(LANDSCAPE)).convert("L"), "PNG")
CLEAR = encoded(Image.open(io.BytesIO(PORTRAIT)).convert("RGBA"), "PNG")


def steps(mode: str, resize: dict) -> list[tuple[str, object]]:
    made = [("decode", {"input": "image", "mode": mode}), ("resize", {"input": "image", **resize})]
    return [(kind, build_step_options(kind, options, Path("."))) for kind, options in made]


def photos(*items: bytes) -> Arrays:
    batch = np.empty(len(items), dtype=object)
    batch[:] = list(items)
    return {"image": batch}


def one_after_the_other(built: list[tuple[str, object]], tensors: Arrays) -> Arrays:
    for _, step in built:
        tensors = step.process(tensors)  # type: ignore[attr-defined]
    return tensors


def rows(images: np.ndarray) -> list[np.ndarray]:
    return list(images)  # a stacked batch or a ragged one, row by row


@pytest.mark.parametrize(
    ("mode", "resize", "items"),
    [
        ("RGB", {"shorter": 256, "interpolation": "bilinear"}, [LANDSCAPE, PORTRAIT]),
        ("RGB", {"shorter": 100, "interpolation": "area"}, [LANDSCAPE, turned()]),
        ("RGB", {"height": 224, "width": 300, "interpolation": "bicubic"}, [LANDSCAPE, GRAY]),
        ("L", {"shorter": 128, "interpolation": "lanczos"}, [GRAY, LANDSCAPE]),
        ("RGBA", {"shorter": 200, "interpolation": "bilinear"}, [CLEAR, LANDSCAPE]),
    ],
)
def test_the_pixels_are_those_of_the_two_steps_one_after_the_other(
    mode: str, resize: dict, items: list[bytes]
) -> None:
    fused = PreprocessPipeline("images", steps(mode, resize)).steps  # ragged: run as is
    together = one_after_the_other(fused, photos(*items))
    apart = one_after_the_other(steps(mode, resize), photos(*items))
    for mine, theirs in zip(rows(together["image"]), rows(apart["image"]), strict=True):
        assert mine.dtype == theirs.dtype == np.uint8
        np.testing.assert_array_equal(mine, theirs)


def test_the_decode_hands_on_images_already_at_the_resizes_size() -> None:
    built = steps("RGB", {"shorter": 256, "interpolation": "bilinear"})
    PreprocessPipeline("images", built)
    decoded = built[0][1].process(photos(LANDSCAPE, PORTRAIT))["image"]  # type: ignore[attr-defined]
    assert [row.shape for row in decoded] == [(256, 341, 3), (341, 256, 3)]


def test_a_resize_of_another_tensor_or_after_a_sized_decode_is_left_to_itself() -> None:
    sized = [
        ("decode", {"input": "image", "mode": "RGB", "height": 300, "width": 400}),
        ("resize", {"input": "image", "shorter": 256}),
    ]
    other = [
        ("decode", {"input": "image", "output": "pixels", "mode": "RGB"}),
        ("resize", {"input": "image", "shorter": 256}),
    ]
    for made in (sized, other):
        built = [(kind, build_step_options(kind, options, Path("."))) for kind, options in made]
        PreprocessPipeline("images", built)
        assert built[0][1].resize_ahead is None  # type: ignore[attr-defined]
