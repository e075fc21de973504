"""How a failed ONNX Runtime run is reported: an input the model cannot take is the request's
fault (INVALID_ARGUMENT, never retried); the model failing while it runs (ORT's FAIL,
RUNTIME_EXCEPTION, out of memory) is UNAVAILABLE, which the gateway's breaker counts and
fails over on."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from services.gateway.upstream.breaker import FAILURES
from services.inference.jobs import Request
from services.inference.manifest import read_spec
from services.inference.model import ModelVersion, load_version
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, Unavailable
from tests.unit.inference.test_inference_toymodels import _finish, write_version

SETTINGS = InferenceSettings(models=["alloc"], workers=2)


def allocating_model() -> onnx.ModelProto:
    """x FP32 [batch, 1] -> x + sum(zeros(max(x))): a model that allocates as much as its
    input says, so a large value makes it fail at run time the way a real model runs out of
    memory."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
        helper.make_node("Cast", ["top"], ["count"], to=TensorProto.INT64),
        helper.make_node("Reshape", ["count", "one"], ["size"]),
        helper.make_node("ConstantOfShape", ["size"], ["zeros"]),
        helper.make_node("ReduceSum", ["zeros"], ["total"], keepdims=0),
        helper.make_node("Add", ["x", "total"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "alloc",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "one")],
    )
    return _finish(graph)


@pytest.fixture
def model(tmp_path: Path) -> ModelVersion:
    write_version(tmp_path, "alloc", 1, allocating_model(), [{"x": np.full((1, 1), 3, "f4")}])
    spec = read_spec(tmp_path / "alloc" / "model.yaml", SETTINGS)
    return load_version(tmp_path / "alloc" / "1", "alloc", 1, spec, ThreadPoolExecutor(2), "t")


def test_a_model_failing_while_it_runs_is_unavailable(model: ModelVersion) -> None:
    with pytest.raises(Unavailable, match=r"model .alloc. version 1 failed while running: .*FAIL"):
        model.run({"x": np.full((1, 1), 1e13, np.float32)})
    assert Unavailable.code in FAILURES


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        ({"x": np.zeros((1, 1), np.float64)}, "Unexpected input data type"),
        ({"x": np.zeros((1, 1, 1), np.float32)}, "Invalid rank"),
        ({}, "missing"),
    ],
)
def test_an_input_the_model_cannot_take_is_invalid_argument(
    model: ModelVersion, inputs: dict, words: str
) -> None:
    with pytest.raises(InvalidArgument, match=rf"cannot run the request: .*{words}"):
        model.run(inputs)
    assert InvalidArgument.code not in FAILURES


def test_in_a_batch_only_the_failing_request_is_unavailable(model: ModelVersion) -> None:
    async def go() -> list[object]:
        values = [1.0, 1e13, 2.0]
        calls = [model.infer({"x": np.full((1, 1), v, np.float32)}, Request()) for v in values]
        return await asyncio.gather(*calls, return_exceptions=True)

    good, bad, other = asyncio.run(go())
    assert isinstance(bad, Unavailable)
    assert good["y"][0, 0] == 1.0 and other["y"][0, 0] == 2.0
