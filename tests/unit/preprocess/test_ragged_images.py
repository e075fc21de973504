"""Photos of different sizes in one batch (a flight carrying a portrait and a landscape):
decode, shorter-side resize and crop take each row as it is, and the batch comes out as if
each photo had been preprocessed alone, in one run (issue 42, item 3)."""

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from bench.images import STEPS, photo_jpeg
from services.preprocess.pipeline import PreprocessPipeline
from services.preprocess.steps import StepError, build_step_options
from strata.calls.v1process import process_all
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec

LANDSCAPE = photo_jpeg(640, 480)
PORTRAIT = photo_jpeg(480, 640)
SQUARE = photo_jpeg(300, 300)


def pipeline(steps: list[tuple[str, dict]] = STEPS) -> PreprocessPipeline:
    built = [(kind, build_step_options(kind, options, Path("."))) for kind, options in steps]
    return PreprocessPipeline(name="images", steps=built)


def photos(*items: bytes) -> dict[str, np.ndarray]:
    batch = np.empty(len(items), dtype=object)
    batch[:] = list(items)
    return {"image": batch}


def test_a_batch_of_mixed_sizes_gives_each_photo_what_it_gives_alone() -> None:
    mixed = [LANDSCAPE, PORTRAIT, SQUARE, PORTRAIT]
    together = pipeline().run(photos(*mixed))["image"]
    assert together.shape == (4, 3, 224, 224) and together.dtype == np.float32
    for row, photo in zip(together, mixed, strict=True):
        np.testing.assert_array_equal(row, pipeline().run(photos(photo))["image"][0])


def test_rows_stay_apart_while_they_differ_and_are_stacked_once_they_agree() -> None:
    tensors = photos(LANDSCAPE, SQUARE, photo_jpeg(320, 240))
    for kind, options in STEPS[:2]:  # decode, resize the shorter side to 256
        tensors = build_step_options(kind, options, Path(".")).process(tensors)
        assert tensors["image"].dtype == object, "still of different sizes"
    decoded = [row.shape for row in tensors["image"]]
    assert decoded == [(256, 341, 3), (256, 256, 3), (256, 341, 3)]
    tensors = photos(LANDSCAPE, photo_jpeg(320, 240))  # of one size once resized
    for kind, options in STEPS[:2]:
        tensors = build_step_options(kind, options, Path(".")).process(tensors)
    assert tensors["image"].shape == (2, 256, 341, 3) and tensors["image"].dtype == np.uint8


def test_a_step_that_takes_one_size_refuses_a_mixed_batch_naming_what_would_fix_it() -> None:
    steps = [STEPS[0], STEPS[3]]  # decode, normalize
    with pytest.raises(StepError, match=r"'normalize' takes images of one size.*crop"):
        pipeline(steps).run(photos(LANDSCAPE, PORTRAIT))


def test_images_still_of_different_sizes_at_the_end_are_refused() -> None:
    with pytest.raises(StepError, match="the model takes images of one size"):
        pipeline(STEPS[:2]).run(photos(LANDSCAPE, PORTRAIT))


def test_a_flight_of_a_portrait_and_a_landscape_runs_once_not_row_by_row() -> None:
    runs = []
    steps = pipeline()

    def handler(name: str, arrays: codec.Arrays, parameters: Mapping[str, str]):
        runs.append(len(arrays["image"]))
        return steps.run(arrays), {}

    item = v1.Request(
        id="f",
        pipeline="images",
        tensors=[codec.to_tensor("image", photos(LANDSCAPE, PORTRAIT, PORTRAIT)["image"])],
    )
    item.members.add(id="landscape", rows=1)
    item.members.add(id="portraits", rows=2)
    result = process_all(v1.ProcessRequest(requests=[item]), handler).results[0]
    assert runs == [3], "one run for the flight"
    assert [m.rows for m in result.members] == [1, 2]
    assert not any(m.HasField("error") for m in result.members)
    assert codec.tensors_to_arrays(result.tensors)["image"].shape == (3, 3, 224, 224)
