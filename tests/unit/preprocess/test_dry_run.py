"""An image pipeline is run at start on a synthetic photo and what it makes is held against
the model's input shapes (issue 51): a `layout` step writing the wrong name, or left out
(channels last where the model takes them first), stops preprocess with a message naming
the pipeline, the step and the tensor."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from services.preprocess.dry_run import synthetic
from services.preprocess.pipeline import build_pipeline
from services.preprocess.wiring import KNOWN_STEPS
from strata.config.pipelines import Pipeline
from strata.config.preprocess import BUILTIN_STEPS
from tests.unit.inference.test_inference_toymodels import _finish

SIZE = 8
STEPS = [
    {"kind": "decode", "input": "image"},
    {"kind": "resize", "input": "image", "shorter": SIZE + 2},
    {"kind": "crop", "input": "image", "height": SIZE, "width": SIZE},
    {"kind": "normalize", "input": "image", "mean": [0.5], "std": [0.25], "scale": 1 / 255},
    {"kind": "layout", "input": "image", "to": "CHW"},
]


def classifier() -> onnx.ModelProto:
    """images FP32 [batch, 3, 8, 8] -> logits [batch, 3] (the mean of each channel)."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["logits"], axes=[2, 3], keepdims=0)],
        "classifier",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 3, SIZE, SIZE])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
    )
    return _finish(graph)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "fruit" / "1"
    folder.mkdir(parents=True)
    onnx.save(classifier(), folder / "model.onnx")
    return tmp_path


def pipeline(steps: list[dict[str, Any]]) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 3]}],
            "preprocess": steps,
            "model": {"name": "fruit"},
        }
    )


def test_every_built_in_step_says_what_it_makes() -> None:
    assert set(BUILTIN_STEPS) == KNOWN_STEPS


def test_an_image_pipeline_that_fits_its_model_builds(root: Path) -> None:
    built = build_pipeline("p", pipeline([*STEPS[:-1], {**STEPS[-1], "output": "images"}]), root)
    assert [label for label, _ in built.steps][1:] == [s["kind"] for s in STEPS]


def test_layout_writing_another_name_than_the_models_input_stops_preprocess(root: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"pipeline 'p': model 'fruit' version 1 takes input 'images', which no "
        r"preprocess step makes \(preprocess ends with \['image'\]\); preprocess step "
        r"'layout' gives 'image' instead",
    ):
        build_pipeline("p", pipeline(STEPS), root)


def test_channels_last_where_the_model_takes_them_first_stops_preprocess(root: Path) -> None:
    with pytest.raises(
        ValueError,
        match=r"pipeline 'p': preprocess step 'normalize' gives 'images' of shape "
        r"\[1, 8, 8, 3\] from a synthetic request, but model 'fruit' version 1 takes "
        r"\[-1, 3, 8, 8\] \(it takes channels first: a `layout` step with to: CHW turns them\)",
    ):
        build_pipeline("p", pipeline([*STEPS[:3], {**STEPS[3], "output": "images"}]), root)


def test_a_crop_of_the_wrong_size_stops_preprocess(root: Path) -> None:
    crop = {**STEPS[2], "height": SIZE - 1}
    with pytest.raises(ValueError, match=r"step 'layout' gives 'images' of shape \[1, 3, 7, 8\]"):
        build_pipeline(
            "p", pipeline([*STEPS[:2], crop, STEPS[3], {**STEPS[4], "output": "images"}]), root
        )


def test_a_plugin_step_that_does_not_say_what_it_makes_is_checked_by_the_dry_run(
    root: Path,
) -> None:
    shrink = {"kind": "tests.support.plugins:Shrink", "name": "shrink", "input": "images"}
    steps = [*STEPS[:-1], {**STEPS[-1], "output": "images"}, shrink]
    with pytest.raises(ValueError, match=r"step 'shrink' gives 'images' of shape \[1, 3, 8, 7\]"):
        build_pipeline("p", pipeline(steps), root)
    # Only some requests show it: those the step cuts. The dry run's zeros are not.
    build_pipeline("p", pipeline([*steps[:-1], {**shrink, "poison": 1.0}]), root)


def test_a_step_that_refuses_the_synthetic_request_leaves_the_rest_to_requests(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    too_large = {**STEPS[2], "height": 1000, "width": 1000}
    build_pipeline(
        "p", pipeline([STEPS[0], too_large, STEPS[3], {**STEPS[4], "output": "images"}]), root
    )
    assert "the start-up dry run stopped at preprocess step 'crop'" in caplog.text


def test_the_synthetic_request_is_of_each_inputs_type() -> None:
    spec = Pipeline.model_validate(
        {
            "inputs": [
                {"name": "image", "datatype": "BYTES", "shape": [-1]},
                {"name": "text", "datatype": "BYTES", "shape": [-1, 1]},
                {
                    "name": "pixels",
                    "datatype": "UINT8",
                    "shape": [-1, -1, -1],
                    "max_shape": [4, 32, 512],
                },
                {"name": "x", "datatype": "FP32", "shape": [-1, 4], "range": [2, 3]},
            ],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
            "preprocess": [STEPS[0]],
            "model": {"name": "m"},
        }
    )
    made = synthetic(spec)
    assert made["image"][0][:2] == b"\xff\xd8"  # a JPEG
    assert made["text"].shape == (1, 1) and made["text"][0, 0].startswith(b"Strata")
    assert made["pixels"].shape == (1, 32, 256) and made["pixels"].dtype == np.uint8
    assert made["x"].tolist() == [[2.0] * 4]
