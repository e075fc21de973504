"""Image steps alone: decode (PNG, JPEG, raw), colour conversion and resize, with edge cases."""

from __future__ import annotations

import io
import re
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from services.preprocess.steps import StepError
from services.preprocess.steps import build_step_options as build

RNG = np.random.default_rng(7)
RGBA = RNG.integers(0, 256, (12, 10, 4), dtype=np.uint8)


def encode(image: Image.Image, fmt: str = "PNG", **options) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, fmt, **options)
    return buffer.getvalue()


def batch(*items: bytes) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


def decode(items: np.ndarray, **options) -> np.ndarray:
    step = build("decode", {"input": "img", **options}, Path("."))
    return step.process({"img": items})["img"]


def png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares width x height but carries almost no data: a bomb's header."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        crc = zlib.crc32(kind + body)
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


# decode


@pytest.mark.parametrize(
    ("mode", "shape"), [("RGB", (2, 12, 10, 3)), ("L", (2, 12, 10)), ("RGBA", (2, 12, 10, 4))]
)
def test_decode_png_matches_pillow(mode: str, shape: tuple) -> None:
    image = Image.fromarray(RGBA, "RGBA")
    out = decode(batch(encode(image), encode(image)), mode=mode)
    assert out.shape == shape and out.dtype == np.uint8
    np.testing.assert_array_equal(out[1], np.asarray(image.convert(mode)))


def test_decode_jpeg_grayscale_and_palette_inputs() -> None:
    rgb = Image.fromarray(RGBA[..., :3], "RGB")
    data = encode(rgb, "JPEG", quality=95)
    jpeg = decode(batch(data), mode="RGB")
    assert jpeg.shape == (1, 12, 10, 3)
    np.testing.assert_array_equal(jpeg[0], np.asarray(Image.open(io.BytesIO(data))))
    gray = Image.fromarray(RGBA[..., 0], "L")
    as_rgb = decode(batch(encode(gray)), mode="RGB")
    np.testing.assert_array_equal(as_rgb[0], np.repeat(RGBA[..., :1], 3, axis=2))
    palette = rgb.convert("P")
    np.testing.assert_array_equal(
        decode(batch(encode(palette)), mode="RGB")[0], np.asarray(palette.convert("RGB"))
    )


def test_decode_sixteen_bit_png_keeps_the_high_byte() -> None:
    deep = (np.arange(120, dtype=np.uint16).reshape(12, 10) * 500).astype(np.uint16)
    out = decode(batch(encode(Image.fromarray(deep))), mode="L")
    np.testing.assert_array_equal(out[0], (deep >> 8).astype(np.uint8))


def test_decode_raw_uint8_arrays_like_encoded_ones() -> None:
    raw = decode(RGBA[None], mode="L")
    png = decode(batch(encode(Image.fromarray(RGBA, "RGBA"))), mode="L")
    np.testing.assert_array_equal(raw, png)
    assert decode(RGBA[None, ..., 0], mode="L").shape == (1, 12, 10)


def test_decode_different_sizes_each_as_it_is_or_to_a_target_size() -> None:
    small = encode(Image.fromarray(RGBA[:6, :5, :3], "RGB"))
    large = encode(Image.fromarray(RGBA[..., :3], "RGB"))
    ragged = decode(batch(small, large))
    assert ragged.dtype == object and [row.shape for row in ragged] == [(6, 5, 3), (12, 10, 3)]
    np.testing.assert_array_equal(ragged[1], decode(batch(large))[0])
    out = decode(batch(small, large), height=8, width=8, interpolation="bilinear")
    assert out.shape == (2, 8, 8, 3) and out.dtype == np.uint8


def test_decode_empty_batch() -> None:
    assert decode(batch(), mode="RGB").shape == (0, 0, 0, 3)
    assert decode(batch(), mode="L", height=4, width=5).shape == (0, 4, 5)


def test_decode_refuses_a_decompression_bomb_before_decompressing() -> None:
    bomb = png_header_only(8000, 8000)
    assert len(bomb) < 200
    with pytest.raises(StepError, match="8000x8000 is 64000000 pixels, more than the 16777216"):
        decode(batch(bomb))
    with pytest.raises(StepError, match="decompression bomb"):
        decode(batch(png_header_only(100_000, 100_000)))


def test_decode_limits_pixels_and_bytes_as_configured() -> None:
    image = encode(Image.fromarray(RGBA, "RGBA"))
    tiny = encode(Image.new("RGB", (1, 1)))
    assert len(tiny) < 100 < len(image)
    with pytest.raises(StepError, match="element 0: 10x12 is 120 pixels, more than the 100"):
        decode(batch(image), max_pixels=100)
    with pytest.raises(StepError, match=f"element 1 is {len(image)} bytes, more than 100"):
        decode(batch(tiny, image), max_bytes=100)
    with pytest.raises(StepError, match="10x12 is 120 pixels"):
        decode(RGBA[None], max_pixels=100)


def test_decode_limits_the_pixels_of_the_whole_request() -> None:
    image = encode(Image.fromarray(RGBA, "RGBA"))
    assert decode(batch(image, image), max_batch_pixels=240).shape[0] == 2
    with pytest.raises(StepError, match="element 2 brings the request to 360 pixels, more than"):
        decode(batch(image, image, image), max_batch_pixels=240)
    # Refused from its header alone: the body of this one would not even decode.
    bomb = png_header_only(4000, 4000)
    with pytest.raises(StepError, match="element 2 brings the request to 16000240 pixels"):
        decode(batch(image, image, bomb), max_batch_pixels=16_000_000)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_decode_refuses_truncated_images(fmt: str) -> None:
    whole = encode(Image.fromarray(RGBA[..., :3], "RGB"), fmt)
    with pytest.raises(
        StepError, match=r"element 0 (is truncated or corrupt|has a corrupt header)"
    ):
        decode(batch(whole[: len(whole) // 2]))


@pytest.mark.parametrize(
    "data", [b"", b"not an image", b"GIF89a" + b"\x00" * 20, b"\x89PNG\r\n\x1a\n"]
)
def test_decode_refuses_what_is_not_png_or_jpeg(data: bytes) -> None:
    with pytest.raises(StepError, match="element 0"):
        decode(batch(data))


def test_decode_refuses_other_layouts() -> None:
    with pytest.raises(StepError, match="images must be UINT8 pixels, got float32"):
        decode(RGBA[None].astype(np.float32))
    with pytest.raises(StepError, match=re.escape("[batch, height, width, 1|3|4]")):
        decode(np.zeros((1, 4, 4, 2), np.uint8))


def test_decode_config_mistakes() -> None:
    with pytest.raises(ValueError, match=r"decode.mode\n  Input should be 'L', 'RGB', 'RGBA' or"):
        build("decode", {"input": "i", "mode": "CMYK"}, Path("."))
    with pytest.raises(ValueError, match=r"decode.width\n  Input should be greater than 0"):
        build("decode", {"input": "i", "height": 4, "width": -1}, Path("."))
    with pytest.raises(ValueError, match="give both height and width, or neither"):
        build("decode", {"input": "i", "height": 4}, Path("."))


# color


@pytest.mark.parametrize("target", ["L", "RGB", "RGBA"])
@pytest.mark.parametrize("source", ["L", "RGB", "RGBA"])
def test_color_matches_pillow(source: str, target: str) -> None:
    image = Image.fromarray(RGBA, "RGBA").convert(source)
    step = build("color", {"input": "x", "mode": target}, Path("."))
    out = step.process({"x": np.asarray(image)[None]})["x"]
    np.testing.assert_array_equal(out[0], np.asarray(image.convert(target)))


def test_color_single_channel_and_background() -> None:
    step = build("color", {"input": "x", "mode": "RGB", "background": 255}, Path("."))
    pixels = np.array([[[[10, 20, 30, 0], [10, 20, 30, 255], [200, 100, 0, 128]]]], np.uint8)
    out = step.process({"x": pixels})["x"]
    # Fully transparent -> the background; opaque -> unchanged; half -> a rounded blend.
    assert out[0, 0].tolist() == [[255, 255, 255], [10, 20, 30], [227, 177, 127]]
    gray = build("color", {"input": "x", "mode": "L"}, Path("."))
    assert gray.process({"x": np.full((1, 2, 2, 1), 9, np.uint8)})["x"].shape == (1, 2, 2)


def test_color_refuses_bad_input_and_config() -> None:
    step = build("color", {"input": "x", "mode": "L"}, Path("."))
    with pytest.raises(StepError, match="must be UINT8"):
        step.process({"x": np.zeros((1, 2, 2, 3), np.float32)})
    with pytest.raises(StepError, match="got shape"):
        step.process({"x": np.zeros((2, 2), np.uint8)})
    for wrong in ([1, 2], 256, True, [0, 0, -1]):
        # One error, naming both forms: not one per member of the union.
        with pytest.raises(ValueError, match=r"1 validation error") as refused:
            build("color", {"input": "x", "mode": "RGB", "background": wrong}, Path("."))
        assert (
            "color.background\n  Value error, must be a gray level 0-255 or [r, g, b] of "
            f"three 0-255, got {wrong!r}"
        ) in str(refused.value)


# resize


@pytest.mark.parametrize("interpolation", ["area", "bilinear", "nearest"])
def test_resize_grayscale_and_colour_batches(interpolation: str) -> None:
    step = build(
        "resize", {"input": "x", "height": 6, "width": 5, "interpolation": interpolation}, Path(".")
    )
    colour = step.process({"x": RGBA[None, ..., :3]})["x"]
    gray = step.process({"x": RGBA[None, ..., 0]})["x"]
    assert colour.shape == (1, 6, 5, 3) and gray.shape == (1, 6, 5)
    np.testing.assert_allclose(colour[..., 0], gray)
    flat = step.process({"x": np.full((2, 12, 10), 7, np.uint8)})["x"]
    np.testing.assert_allclose(flat, 7)


def test_resize_area_averages_blocks_and_handles_empty_batches() -> None:
    step = build("resize", {"input": "x", "height": 1, "width": 1}, Path("."))
    assert step.process({"x": np.array([[[0, 2], [4, 6]]], np.uint8)})["x"].tolist() == [[[3.0]]]
    assert step.process({"x": np.zeros((0, 4, 4), np.uint8)})["x"].shape == (0, 1, 1)


def test_resize_refuses_bad_input_and_config() -> None:
    step = build("resize", {"input": "x", "height": 2, "width": 2}, Path("."))
    with pytest.raises(StepError, match="got shape"):
        step.process({"x": np.zeros((2, 3), np.uint8)})
    with pytest.raises(StepError, match="needs pixel numbers"):
        step.process({"x": np.empty((1, 2, 2), dtype=object)})
    with pytest.raises(ValueError, match=r"resize.interpolation\n  Input should be 'area', 'bi"):
        build(
            "resize", {"input": "x", "height": 2, "width": 2, "interpolation": "cubic"}, Path(".")
        )


def test_resize_matches_pillow_antialiased_filters() -> None:
    image = Image.fromarray(RGBA[..., :3], "RGB").resize((40, 48))
    pixels = np.asarray(image)
    for interpolation, resample in [
        ("bilinear", Image.Resampling.BILINEAR),
        ("bicubic", Image.Resampling.BICUBIC),
        ("lanczos", Image.Resampling.LANCZOS),
    ]:
        step = build(
            "resize",
            {"input": "x", "height": 9, "width": 7, "interpolation": interpolation},
            Path("."),
        )
        out = step.process({"x": pixels[None]})["x"]
        assert out.dtype == np.uint8  # UINT8 stays UINT8: a crop of it crosses hops small
        np.testing.assert_array_equal(out[0], np.asarray(image.resize((7, 9), resample)))


def test_resize_floats_unrounded_and_other_channel_counts_of_uint8_rounded() -> None:
    step = build("resize", {"input": "x", "height": 1, "width": 1}, Path("."))
    floats = np.array([[[0.0, 1.0], [2.0, 4.5]]], np.float32)
    assert step.process({"x": floats})["x"].tolist() == [[[1.875]]]
    rgba = np.zeros((1, 2, 2, 4), np.uint8)
    rgba[0, 0, 0] = [1, 2, 3, 6]
    np.testing.assert_allclose(
        step.process({"x": rgba.astype(np.float32)})["x"], [[[[0.25, 0.5, 0.75, 1.5]]]]
    )
    rounded = step.process({"x": rgba})["x"]
    assert rounded.dtype == np.uint8 and rounded.tolist() == [[[[0, 0, 1, 2]]]]


def test_resize_shorter_side_keeps_the_aspect_as_torchvision() -> None:
    step = build("resize", {"input": "x", "shorter": 256}, Path("."))
    assert step.process({"x": np.zeros((2, 480, 640, 3), np.uint8)})["x"].shape == (2, 256, 341, 3)
    assert step.process({"x": np.zeros((1, 640, 480), np.uint8)})["x"].shape == (1, 341, 256)
    with pytest.raises(ValueError, match="give height and width, or shorter, not both"):
        build("resize", {"input": "x", "shorter": 4, "height": 4}, Path("."))
    with pytest.raises(ValueError, match="give height and width, or shorter"):
        build("resize", {"input": "x", "height": 4}, Path("."))


# crop, pad, layout, normalize


def test_crop_centre_and_box() -> None:
    images = np.arange(2 * 5 * 6).reshape(2, 5, 6).astype(np.uint8)
    centre = build("crop", {"input": "x", "height": 2, "width": 3}, Path("."))
    np.testing.assert_array_equal(centre.process({"x": images})["x"], images[:, 2:4, 2:5])
    box = build("crop", {"input": "x", "height": 2, "width": 2, "top": 3, "left": 4}, Path("."))
    np.testing.assert_array_equal(box.process({"x": images})["x"], images[:, 3:5, 4:6])
    too_big = build("crop", {"input": "x", "height": 6, "width": 2}, Path("."))
    with pytest.raises(StepError, match="a 2x6 crop at left 2, top 0 does not fit images of 6x5"):
        too_big.process({"x": images})
    with pytest.raises(ValueError, match="give both top and left"):
        build("crop", {"input": "x", "height": 2, "width": 2, "top": 1}, Path("."))


def test_pad_keeps_the_type_and_checks_the_value() -> None:
    step = build("pad", {"input": "x", "top": 1, "right": 2, "value": 9}, Path("."))
    out = step.process({"x": np.zeros((1, 2, 2, 3), np.uint8)})["x"]
    assert out.shape == (1, 3, 4, 3) and out.dtype == np.uint8
    assert out[0, 0, 0].tolist() == [9, 9, 9] and out[0, 1, 0].tolist() == [0, 0, 0]
    wide = build("pad", {"input": "x", "left": 1, "value": 300}, Path("."))
    with pytest.raises(StepError, match=r"pad value 300\.0 does not fit uint8 pixels"):
        wide.process({"x": np.zeros((1, 2, 2), np.uint8)})


def test_layout_both_ways_and_grayscale() -> None:
    images = RNG.integers(0, 256, (2, 3, 4, 3), dtype=np.uint8)
    chw = build("layout", {"input": "x", "to": "CHW"}, Path(".")).process({"x": images})["x"]
    assert chw.shape == (2, 3, 3, 4) and chw.flags.c_contiguous
    hwc = build("layout", {"input": "x", "to": "HWC"}, Path(".")).process({"x": chw})["x"]
    np.testing.assert_array_equal(hwc, images)
    gray = build("layout", {"input": "x", "to": "CHW"}, Path("."))
    assert gray.process({"x": images[..., 0]})["x"].shape == (2, 1, 3, 4)


def test_normalize_per_channel_in_either_layout() -> None:
    options = {"input": "x", "mean": [0.5, 0.25, 0.0], "std": [0.5, 0.25, 2.0], "scale": 0.5}
    pixels = np.full((1, 2, 2, 3), 2, np.uint8)
    out = build("normalize", options, Path(".")).process({"x": pixels})["x"]
    assert out.dtype == np.float32 and out[0, 0, 0].tolist() == [1.0, 3.0, 0.5]
    chw = build("normalize", {**options, "layout": "CHW"}, Path("."))
    out = chw.process({"x": pixels.transpose(0, 3, 1, 2)})["x"]
    assert out[0, :, 0, 0].tolist() == [1.0, 3.0, 0.5]
    with pytest.raises(StepError, match="3 means and stds for 4 channels"):
        build("normalize", options, Path(".")).process({"x": np.zeros((1, 2, 2, 4))})
    with pytest.raises(ValueError, match="2 means but 1 stds"):
        build("normalize", {"input": "x", "mean": [0, 1], "std": [1]}, Path("."))
    with pytest.raises(ValueError, match=r"normalize.std.0\n  Input should be greater than 0"):
        build("normalize", {"input": "x", "mean": [0], "std": [0]}, Path("."))


def test_color_and_decode_to_bgr() -> None:
    image = Image.fromarray(RGBA[..., :3], "RGB")
    out = decode(batch(encode(image)), mode="BGR")
    np.testing.assert_array_equal(out[0], RGBA[..., 2::-1])
    step = build("color", {"input": "x", "mode": "BGR"}, Path("."))
    np.testing.assert_array_equal(step.process({"x": RGBA[None]})["x"][0], RGBA[..., 2::-1])
