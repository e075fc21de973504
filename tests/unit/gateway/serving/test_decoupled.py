"""A decoupled pipeline (services/gateway/serving/decoupled.py, strata.config.pipelines.Decoupled):
the answer split into its responses, Triton's final flags, the model config, and the
settings refused at load."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from services.gateway.serving import decoupled
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument, NotReady
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.v2meta import model_config

REPEAT: dict[str, Any] = {
    "max_batch_size": 0,
    "decoupled": True,
    "inputs": [{"name": "IN", "datatype": "INT32", "shape": [-1], "allow_empty": True}],
    "outputs": [
        {"name": "OUT", "datatype": "INT32", "shape": [1]},
        {"name": "IDX", "datatype": "UINT32", "shape": [1]},
    ],
    "model": {"name": "repeat"},
}


def test_response_i_carries_each_outputs_row_i() -> None:
    outputs = {"OUT": np.array([[7], [8], [9]]), "IDX": np.array([[0], [1], [2]], np.uint32)}
    parts = decoupled.split("repeat", outputs, 3)
    assert [{n: a.tolist() for n, a in part.items()} for part in parts] == [
        {"OUT": [7], "IDX": [0]},
        {"OUT": [8], "IDX": [1]},
        {"OUT": [9], "IDX": [2]},
    ]


def test_an_answer_of_no_rows_is_no_responses() -> None:
    outputs = {"OUT": np.zeros((0, 1), np.int32), "IDX": np.zeros((0, 1), np.uint32)}
    assert decoupled.split("repeat", outputs, 3) == []


def test_more_responses_than_the_limit_fail_the_request_naming_it() -> None:
    with pytest.raises(InvalidArgument, match=r"has 4 responses, more than the 3 .*max_respon"):
        decoupled.split("repeat", {"OUT": np.zeros((4, 1))}, 3)


@pytest.mark.parametrize(
    "outputs",
    [
        {"OUT": np.zeros((2, 1)), "IDX": np.zeros((3, 1))},
        {"OUT": np.zeros(2), "IDX": np.int32(1)},
        {"IDX": np.int32(1), "OUT": np.zeros(2)},
        {"IDX": np.int32(1)},
    ],
)
def test_outputs_without_one_response_dimension_are_the_servers_fault(outputs: dict) -> None:
    with pytest.raises(NotReady, match="do not share a leading response dimension"):
        decoupled.split("repeat", outputs, 8)


def asking(final: bool) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="repeat", id="r")
    if final:
        request.parameters[decoupled.ENABLE_EMPTY_FINAL].bool_param = True
    return request


def responses(count: int) -> list[v2.ModelInferResponse]:
    return [v2.ModelInferResponse(model_name="repeat", id="r") for _ in range(count)]


def finals(sent: list[v2.ModelInferResponse]) -> list[bool | None]:
    return [
        r.parameters[decoupled.FINAL].bool_param if decoupled.FINAL in r.parameters else None
        for r in sent
    ]


def test_without_the_request_asking_no_response_is_flagged() -> None:
    head = v2.ModelInferResponse(id="r")
    assert finals(decoupled.flagged(asking(False), head, responses(2), True)) == [None, None]
    assert decoupled.flagged(asking(False), head, [], True) == []


def test_a_decoupled_answer_ends_with_an_empty_final_response() -> None:
    head = v2.ModelInferResponse(model_name="repeat", id="r")
    sent = decoupled.flagged(asking(True), head, responses(2), True)
    assert finals(sent) == [False, False, True]
    assert sent[-1] is head and not head.outputs
    assert finals(decoupled.flagged(asking(True), v2.ModelInferResponse(), [], True)) == [True]


def test_another_pipelines_one_response_is_its_final_one() -> None:
    head = v2.ModelInferResponse(id="r")
    assert finals(decoupled.flagged(asking(True), head, responses(1), False)) == [True]


def test_the_model_config_says_decoupled_and_one_responses_shape() -> None:
    pipeline = Pipeline(**REPEAT)
    config = model_config(
        "repeat", "strata_pipeline", 0, pipeline.inputs, pipeline.outputs, decoupled=True
    ).config
    assert config.model_transaction_policy.decoupled
    assert [list(o.dims) for o in config.output] == [[1], [1]]
    plain = model_config("p", "strata_pipeline", 0, pipeline.inputs, pipeline.outputs).config
    assert not plain.HasField("model_transaction_policy")


def test_the_answer_has_a_response_dimension_before_each_declared_output() -> None:
    pipeline = Pipeline(**REPEAT)
    assert pipeline.decoupled is not None and pipeline.decoupled.max_responses == 1024
    assert [spec.shape for spec in pipeline.answer_outputs()] == [[-1, 1], [-1, 1]]
    assert Pipeline(**{**REPEAT, "decoupled": False}).decoupled is None


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"max_batch_size": 4}, "needs max_batch_size 0"),
        ({"decoupled": {"max_responses": 0}}, "greater than 0"),
        ({"sequence": {}}, "takes no sequence"),
        (
            {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "allow_empty": True}]},
            "allow_empty needs a variable (-1) dimension",
        ),
    ],
)
def test_settings_that_make_no_sense_are_refused_at_load(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Pipeline(**{**REPEAT, **changes})
