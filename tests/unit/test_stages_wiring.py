"""A pipeline of several models is checked at start against each model's signature: every
stage's inputs fed by tensors that are there, of the model's datatypes and ranks, its
outputs known, a conditional stage giving only what an earlier model gave (the rows it
passes over keep that), its condition's tensor there and numeric; postprocess then follows
what the models gave. A mistake is a ValueError naming pipeline, stage and tensor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
import pytest
from pydantic import ValidationError

from services.postprocess.rule_chain import build_chain
from services.preprocess.pipeline import build_pipeline
from strata.config.pipelines import Pipeline
from strata.config.postprocess import PostprocessSettings
from tests.unit.inference.test_inference_toymodels import dense, pooling_model

DECLARED = {"name": "probabilities", "datatype": "FP32", "shape": [-1, 3]}
SOFTMAX = {"kind": "softmax", "input": "y", "output": "probabilities"}
LARGE = {"name": "large", "model": {"name": "big"}, "inputs": {"x": "x"}}
UNSURE = {"tensor": "y", "below": 0.9}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Models `m` and `big`, x FP32 [batch, 4] -> y FP32 [batch, 3], and `pool`, which
    takes ids INT64 and mask FP32 [batch, seq]."""
    for name, model in (("m", dense(0)), ("big", dense(1, hidden=8)), ("pool", pooling_model())):
        folder = tmp_path / name / "1"
        folder.mkdir(parents=True)
        onnx.save(model, folder / "model.onnx")
    return tmp_path


def pipeline(stages: list[dict], **overrides: Any) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [DECLARED],
            "model": {"name": "m"},
            "stages": stages,
            "postprocess": [SOFTMAX],
            **overrides,
        }
    )


def build_both(spec: Pipeline, root: Path) -> None:
    build_pipeline("p", spec, root)
    build_chain("p", spec, root, PostprocessSettings())


def test_a_cascade_and_a_chain_that_fit_their_models_build(root: Path) -> None:
    build_both(pipeline([{**LARGE, "when": UNSURE}]), root)
    # An embedding-like chain: the second model reads what the first gave, renamed.
    chained = {"name": "then", "model": {"name": "big"}, "inputs": {"x": "x"}}
    renamed = {**chained, "outputs": {"y": "z"}}
    softmax_z = {"kind": "softmax", "input": "z", "output": "probabilities"}
    build_both(pipeline([renamed], postprocess=[softmax_z]), root)


@pytest.mark.parametrize(
    ("stage", "message"),
    [
        (
            {**LARGE, "inputs": {"features": "x"}},
            r"pipeline 'p': stage 'large' \(model 'big' version 1\): the model takes no input "
            r"'features' \(its inputs: \['x'\]\)",
        ),
        (
            {**LARGE, "inputs": {"x": "pixels"}},
            "stage 'large' .*: input 'x' is fed by 'pixels', which neither preprocess nor an "
            "earlier model gives",
        ),
        (
            {**LARGE, "outputs": {"logits": "y"}},
            "stage 'large' .*: outputs renames 'logits', which the model does not give",
        ),
        (
            {**LARGE, "when": {"tensor": "scores", "below": 0.9}},
            "stage 'large' .*: its condition reads 'scores', which nothing before it gives",
        ),
        (
            {**LARGE, "outputs": {"y": "y2"}, "when": UNSURE},
            "stage 'large' .*: runs on a condition, so it may only give tensors an earlier "
            "model gave.*it gives 'y2'",
        ),
        (
            {"name": "pool", "model": {"name": "pool"}, "inputs": {"ids": "x", "mask": "x"}},
            "stage 'pool' .*: input 'ids' is fed by 'x', a FP32 tensor, but the model takes INT64",
        ),
        (
            {"name": "pool", "model": {"name": "pool"}, "inputs": {"ids": "x"}},
            "stage 'pool' .*: the model's input 'mask' is fed by nothing",
        ),
    ],
)
def test_a_stage_that_does_not_fit_its_model_stops_the_service(
    root: Path, stage: dict, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        build_chain("p", pipeline([stage]), root, PostprocessSettings())


def test_a_fallback_is_checked_as_the_stage_it_stands_in_for(root: Path) -> None:
    fits = {**LARGE, "when": UNSURE, "fallback": {"model": {"name": "m"}, "from_level": 2}}
    build_both(pipeline([fits]), root)
    misfit = {**LARGE, "fallback": {"model": {"name": "pool"}}}
    with pytest.raises(
        ValueError,
        match=r"stage 'large' \(model 'pool' version 1\): the model takes no input 'x'",
    ):
        build_chain("p", pipeline([misfit]), root, PostprocessSettings())


def test_the_first_models_fallback_is_checked_as_the_model_it_stands_in_for(root: Path) -> None:
    build_both(pipeline([{**LARGE, "when": UNSURE}], fallback={"model": {"name": "big"}}), root)
    misfit = pipeline([], fallback={"model": {"name": "pool"}})
    with pytest.raises(
        ValueError, match=r"pipeline 'p': model 'pool' version 1 takes input 'ids', which no"
    ):
        build_pipeline("p", misfit, root)
    with pytest.raises(ValueError, match=r"\(with model 'pool' version 1\) reads tensor 'y'"):
        build_chain("p", misfit, root, PostprocessSettings())


def test_parallel_stages_read_what_was_there_before_them_and_give_apart(root: Path) -> None:
    beside = {"name": "beside", "model": {"name": "m"}, "parallel": True}
    fanned = [
        {**LARGE, "outputs": {"y": "y_big"}},
        {**beside, "inputs": {"x": "x"}, "outputs": {"y": "y_m"}},
    ]
    merge = {"kind": "mean", "inputs": ["y", "y_big", "y_m"], "output": "y"}
    build_both(pipeline(fanned, postprocess=[merge, SOFTMAX]), root)
    reads_mate = [fanned[0], {**fanned[1], "inputs": {"x": "y_big"}}]
    with pytest.raises(ValueError, match=r"stage 'beside' .*: input 'x' is fed by 'y_big', which"):
        build_chain("p", pipeline(reads_mate), root, PostprocessSettings())
    clash = [fanned[0], {**fanned[1], "outputs": {"y": "y_big"}}]
    with pytest.raises(
        ValueError, match="stage 'beside' runs beside the stage before it and both give 'y_big'"
    ):
        build_chain("p", pipeline(clash), root, PostprocessSettings())


def test_postprocess_follows_what_the_stages_gave(root: Path) -> None:
    later = {"name": "after", "model": {"name": "big"}, "inputs": {"x": "x"}, "outputs": {"y": "z"}}
    with pytest.raises(
        ValueError,
        match=r"postprocess rule 'softmax' \(with model 'm' version 1, model 'big' version 1\) "
        r"reads tensor 'w', which nothing before it makes \(there: \['y', 'z'\]\)",
    ):
        spec = pipeline([later], postprocess=[{**SOFTMAX, "input": "w"}])
        build_chain("p", spec, root, PostprocessSettings())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stages": [{**LARGE, "name": "m"}]}, "stage names repeat"),
        ({"stages": [{**LARGE, "when": {"tensor": "y"}}]}, "give exactly one of below, above"),
        (
            {"stages": [{**LARGE, "when": {"tensor": "y", "below": 0.5, "above": 0.1}}]},
            "give exactly one of below, above",
        ),
        ({"stages": [{**LARGE, "inputs": {}}]}, "inputs"),
        ({"stages": [{**LARGE, "parallel": True}]}, "the first stage has none"),
        (
            {"stages": [{**LARGE, "fallback": {"model": {"name": "m"}, "from_level": 4}}]},
            "from_level",
        ),
        (
            {
                "stages": [
                    {**LARGE, "fallback": {"model": {"name": "m", "shadow": {"deployment": "a"}}}}
                ]
            },
            "a fallback model takes no shadow",
        ),
        (
            {"fallback": {"model": {"name": "m", "shadow": {"deployment": "a"}}}},
            "a fallback model takes no shadow",
        ),
        (
            {"stages": [{**LARGE, "name": "m/fallback"}], "fallback": {"model": {"name": "big"}}},
            "a stage's name has no '/'",
        ),
        (
            {
                "stages": [LARGE],
                "max_batch_size": 0,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [4]}],
                "outputs": [{**DECLARED, "shape": [3]}],
            },
            "stages carry rows of a batch",
        ),
    ],
)
def test_the_config_refuses_a_graph_it_cannot_run(overrides: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        Pipeline.model_validate(
            {
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [DECLARED],
                "model": {"name": "m"},
                "postprocess": [SOFTMAX],
                **overrides,
            }
        )
