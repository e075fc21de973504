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
from strata.plugins import StepError
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
        assert built[0][1].ahead is None  # type: ignore[attr-defined]


def with_crop(mode: str, resize: dict, crop: dict) -> list[tuple[str, object]]:
    made = [
        ("decode", {"input": "image", "mode": mode}),
        ("resize", {"input": "image", **resize}),
        ("crop", {"input": "image", **crop}),
    ]
    return [(kind, build_step_options(kind, options, Path("."))) for kind, options in made]


CENTRE = {"height": 224, "width": 224}


@pytest.mark.parametrize(
    ("mode", "resize", "crop", "items"),
    [
        ("RGB", {"shorter": 256, "interpolation": "bilinear"}, CENTRE, [LANDSCAPE, PORTRAIT]),
        ("RGB", {"shorter": 256, "interpolation": "area"}, CENTRE, [LANDSCAPE, turned()]),
        ("RGB", {"shorter": 240, "interpolation": "bicubic"}, CENTRE, [LANDSCAPE, GRAY]),
        ("L", {"shorter": 128, "interpolation": "lanczos"}, {"height": 100, "width": 90}, [GRAY]),
        ("RGBA", {"shorter": 256, "interpolation": "bilinear"}, CENTRE, [CLEAR, LANDSCAPE]),
        (
            "RGB",
            {"height": 300, "width": 300, "interpolation": "bilinear"},
            {"height": 200, "width": 100, "top": 10, "left": 150, "output": "crop"},
            [PORTRAIT, LANDSCAPE],
        ),
    ],
)
def test_a_crop_after_the_resize_is_resized_alone_to_the_same_pixels_within_a_level(
    mode: str, resize: dict, crop: dict, items: list[bytes]
) -> None:
    fused = PreprocessPipeline("images", with_crop(mode, resize, crop)).steps
    together = one_after_the_other(fused, photos(*items))
    apart = one_after_the_other(with_crop(mode, resize, crop), photos(*items))
    assert together.keys() == apart.keys()
    name = crop.get("output", "image")
    assert together[name].shape == apart[name].shape
    assert together[name].dtype == apart[name].dtype == np.uint8
    differ = np.abs(together[name].astype(int) - apart[name].astype(int))
    assert differ.max() <= 1
    assert np.count_nonzero(differ) <= differ.size // 100  # 0.02-0.3% of them here
    if resize["interpolation"] == "area" or mode == "RGBA":  # box filter; numpy's own path
        np.testing.assert_array_equal(together[name], apart[name])


def test_pixels_given_as_an_array_are_resized_and_cropped_by_the_decode_alike() -> None:
    pixels = np.asarray(Image.open(io.BytesIO(LANDSCAPE)))[None]
    resize = {"shorter": 256, "interpolation": "bilinear"}
    fused = PreprocessPipeline("images", with_crop("RGB", resize, CENTRE)).steps
    together = one_after_the_other(fused, {"image": pixels})
    apart = one_after_the_other(with_crop("RGB", resize, CENTRE), {"image": pixels})
    np.testing.assert_array_equal(together["image"], apart["image"])


def test_a_crop_that_does_not_fit_is_refused_with_its_own_message() -> None:
    resize = {"shorter": 128, "interpolation": "bilinear"}
    fused = PreprocessPipeline("images", with_crop("RGB", resize, CENTRE)).steps
    with pytest.raises(StepError, match=r"a 224x224 crop .* does not fit images of 170x128"):
        one_after_the_other(fused, photos(LANDSCAPE))


def test_a_crop_of_another_tensor_is_left_to_itself() -> None:
    made = [
        ("decode", {"input": "image", "mode": "RGB"}),
        ("resize", {"input": "image", "shorter": 256}),
        ("crop", {"input": "other", "height": 8, "width": 8}),
    ]
    built = [(kind, build_step_options(kind, options, Path("."))) for kind, options in made]
    PreprocessPipeline("images", built)
    ahead = built[0][1].ahead  # type: ignore[attr-defined]
    assert ahead is not None and ahead.crop is None
    assert not built[1][1].done_in_decode  # type: ignore[attr-defined]
    assert not built[2][1].done_in_decode  # type: ignore[attr-defined]


def test_a_resize_told_to_keep_the_whole_image_gives_exactly_the_pixels_of_the_two_steps() -> None:
    resize = {"shorter": 256, "interpolation": "bilinear", "crop_window": False}
    built = with_crop("RGB", resize, CENTRE)
    PreprocessPipeline("images", built)
    assert built[0][1].ahead.crop is None  # type: ignore[attr-defined]
    together = one_after_the_other(built, photos(LANDSCAPE, PORTRAIT))
    apart = one_after_the_other(with_crop("RGB", resize, CENTRE), photos(LANDSCAPE, PORTRAIT))
    np.testing.assert_array_equal(together["image"], apart["image"])
