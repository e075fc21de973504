"""Each request counted (services/gateway/serving/counting.py): by pipeline, code and
protocol, a name no pipeline has under one label, and a pipeline faulted by the server's
own failure (FAILED_PRECONDITION) until one of its requests answers again."""

import pytest
from prometheus_client import REGISTRY

from services.gateway.serving.counting import UNKNOWN, Counting
from strata.errors import InvalidArgument, NotFound, NotReady
from strata.proto.inference import grpc_service_pb2 as v2

PIPELINE = "counted-pipeline"


def requests(pipeline: str, code: str) -> float:
    labels = {"pipeline": pipeline, "code": code, "protocol": "grpc"}
    return REGISTRY.get_sample_value("strata_gateway_requests_total", labels) or 0.0


def fail(counting: Counting, name: str, exc: Exception) -> None:
    with pytest.raises(type(exc)), counting.counted(name, "grpc"):
        raise exc


def answer(counting: Counting, name: str) -> None:
    with counting.counted(name, "grpc") as count:
        count.answered(v2.ModelInferResponse(model_name=name))


def test_the_servers_own_failure_faults_its_pipeline_until_it_answers() -> None:
    counting = Counting(lambda name: name == PIPELINE)
    fail(counting, PIPELINE, NotReady("it does not make what it declares"))
    assert counting.faulted(PIPELINE)
    fail(counting, PIPELINE, InvalidArgument("a client's mistake"))
    assert counting.faulted(PIPELINE), "a client's mistake says nothing of the pipeline"
    answer(counting, PIPELINE)
    assert not counting.faulted(PIPELINE)


def test_requests_are_counted_by_code_and_unknown_names_under_one_label() -> None:
    counting = Counting(lambda name: name == PIPELINE)
    before = requests(PIPELINE, "OK"), requests(PIPELINE, "INVALID_ARGUMENT")
    unknown = requests(UNKNOWN, "NOT_FOUND")
    answer(counting, PIPELINE)
    fail(counting, PIPELINE, InvalidArgument("bad input"))
    fail(counting, "no-such-pipeline", NotFound("unknown model"))
    assert (requests(PIPELINE, "OK"), requests(PIPELINE, "INVALID_ARGUMENT")) == (
        before[0] + 1,
        before[1] + 1,
    )
    assert requests(UNKNOWN, "NOT_FOUND") == unknown + 1
    assert requests("no-such-pipeline", "NOT_FOUND") == 0
    assert not counting.faulted("no-such-pipeline")
