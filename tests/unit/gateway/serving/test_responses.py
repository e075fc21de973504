"""An answer as the v2 response (services/gateway/serving/responses.py), and the outputs
picked from it (serving/inference.py): how it was made in strata.* parameters, outputs in
shared memory described in place of their bytes, and a required output a skipped rule did
not make failing the request."""

import numpy as np
import pytest

from services.gateway.request import Answer
from services.gateway.serving.inference import _produced
from services.gateway.serving.responses import response
from services.gateway.serving.shared_memory import REGION, SIZE, Placement
from strata.config.pipelines import Pipeline
from strata.errors import Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

REQUEST = v2.ModelInferRequest(model_name="p", id="r1")
LABELS = np.array([[1, 2]], dtype=np.int64)
SCORES = np.array([[0.25, 0.75]], dtype=np.float32)


def test_the_parameters_say_how_the_answer_was_made() -> None:
    plain = response(REQUEST, Answer({}, "a", "2", 0), {}, {}).parameters
    assert (plain["strata.arm"].string_param, plain["strata.model_version"].string_param) == (
        "a",
        "2",
    )
    assert plain["strata.level"].int64_param == 0 and not plain["strata.degraded"].bool_param
    assert not {"strata.degraded_source", "strata.cached", "strata.skipped_rules"} & set(plain)
    answer = Answer({}, "b", "", 3, "cache", True, "labels", "m1,m2")
    made = response(REQUEST, answer, {}, {}).parameters
    assert made["strata.degraded"].bool_param and made["strata.cached"].bool_param
    assert made["strata.degraded_source"].string_param == "cache"
    assert made["strata.skipped_rules"].string_param == "labels"
    assert made["strata.stages"].string_param == "m1,m2"


def test_an_output_placed_in_shared_memory_is_described_and_keeps_the_others_places() -> None:
    outputs = {"scores": SCORES, "labels": LABELS}
    placed = {"scores": Placement("region-1", 0, SCORES.nbytes)}
    message = response(REQUEST, Answer(outputs, "a", "1", 0), outputs, placed)
    assert (message.model_name, message.model_version, message.id) == ("p", "1", "r1")
    scores, labels = message.outputs
    assert (scores.name, scores.datatype, list(scores.shape)) == ("scores", "FP32", [1, 2])
    assert scores.parameters[REGION].string_param == "region-1"
    assert scores.parameters[SIZE].int64_param == SCORES.nbytes
    assert REGION not in labels.parameters
    assert list(message.raw_output_contents) == [b"", codec.to_raw(LABELS)]


def pipeline(optional: bool) -> Pipeline:
    return Pipeline.model_validate(
        {
            "model": {"name": "m", "routes": [{"arm": "a", "deployment": "inference-a"}]},
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [2]}],
            "outputs": [
                {"name": "scores", "datatype": "FP32", "shape": [2]},
                {"name": "labels", "datatype": "INT64", "shape": [2], "optional": optional},
            ],
        }
    )


def test_a_missing_output_is_left_out_where_optional_and_fails_where_required() -> None:
    answer = Answer({"scores": SCORES}, "a", "1", 1, skipped_rules="labels")
    wanted = ["scores", "labels"]
    assert list(_produced("p", pipeline(optional=True), answer, wanted)) == ["scores"]
    with pytest.raises(Unavailable, match="'labels' was not produced \\(skipped rules: labels\\)"):
        _produced("p", pipeline(optional=False), answer, wanted)
