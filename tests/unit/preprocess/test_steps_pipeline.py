"""Preprocess pipelines: validation first, steps in order, names, per-step timings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from services.preprocess.metrics import StepTimings
from services.preprocess.pipeline import PreprocessPipelines, build_pipeline
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument, NotFound


def spec(*steps: dict) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 2]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}],
            "model": {"name": "m"},
            "preprocess": list(steps),
        }
    )


CLIP = {"kind": "clip", "input": "x", "low": 0, "high": 1}
SCALE = {"kind": "scale", "input": "x", "factor": 10}


def test_steps_run_in_order_after_validation() -> None:
    pipeline = build_pipeline("p", spec(CLIP, SCALE), Path("."))
    assert [label for label, _ in pipeline.steps] == ["validate", "clip", "scale"]
    out = pipeline.run({"x": np.array([[-1, 0.5]], np.float32)})
    assert out["x"].tolist() == [[0, 5]]


@pytest.mark.parametrize(
    ("tensors", "words"),
    [
        ({"x": np.zeros((1, 3), np.float32)}, "dimension 1 is 3, expected 2"),
        ({"x": np.zeros((1, 2), np.float64)}, "datatype FP64"),
        ({"x": np.array([[np.nan, 0]], np.float32)}, "NaN"),
        ({"z": np.zeros((1, 2), np.float32)}, "unknown input 'z'"),
    ],
)
def test_validation_refuses_bad_input_before_any_step(tensors: dict, words: str) -> None:
    timings = StepTimings()
    pipeline = build_pipeline("p", spec(CLIP), Path("."), timings)
    with pytest.raises(InvalidArgument, match=words):
        pipeline.run(tensors)
    assert set(timings.snapshot()) == {("p", "validate")}  # recorded, even when refusing


def test_every_step_is_timed_and_hooks_see_each_one() -> None:
    timings = StepTimings()
    seen = []
    timings.add_hook(lambda pipeline, step, seconds: seen.append((pipeline, step, seconds)))
    pipeline = build_pipeline("p", spec(CLIP, {**SCALE, "name": "times_ten"}), Path("."), timings)
    for _ in range(3):
        pipeline.run({"x": np.zeros((4, 2), np.float32)})
    summary = timings.snapshot()
    assert set(summary) == {("p", "validate"), ("p", "clip"), ("p", "times_ten")}
    assert all(
        s.count == 3 and 0 < s.total_seconds / s.count <= s.max_seconds for s in summary.values()
    )
    assert [(p, s) for p, s, _ in seen[:3]] == [
        ("p", "validate"),
        ("p", "clip"),
        ("p", "times_ten"),
    ]


@pytest.mark.parametrize(
    "steps",
    [
        (CLIP, CLIP),
        ({**CLIP, "name": "validate"},),
        ({**CLIP, "name": "s"}, {**SCALE, "name": "s"}),
    ],
)
def test_a_taken_name_is_refused_naming_the_pipeline_and_step(steps: tuple) -> None:
    with pytest.raises(ValueError, match="pipeline 'p': preprocess step") as info:
        build_pipeline("p", spec(*steps), Path("."))
    assert "the name is taken" in str(info.value)


@pytest.mark.parametrize(
    ("step", "words"),
    [
        ({**CLIP, "core": False}, "preprocess.0.clip.core\n  Extra inputs are not permitted"),
        ({**CLIP, "timeout_seconds": 1}, "preprocess.0.clip.timeout_seconds\n  Extra inputs"),
        # A kind that is no built-in must at least look like code (an entry point's name is
        # only looked up where the step runs: tests/unit/test_plugins.py).
        (
            {"kind": "sharp en", "input": "x"},
            "preprocess.0.<plugin>.kind\n  Value error, 'sharp en'",
        ),
        ({"kind": "clip", "low": 0}, "preprocess.0.clip.input\n  Field required"),
    ],
)
def test_rule_keys_and_unknown_kinds_are_refused_by_the_config(step: dict, words: str) -> None:
    with pytest.raises(ValidationError) as info:
        spec(step)
    assert words in str(info.value)


def test_unknown_pipeline_is_not_found() -> None:
    pipelines = PreprocessPipelines({"p": build_pipeline("p", spec(), Path("."))})
    with pytest.raises(NotFound, match="unknown pipeline 'q'"):
        pipelines.get("q")
