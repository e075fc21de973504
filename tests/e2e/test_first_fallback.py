"""A pipeline's first model may name a fallback, as a later stage may: a cheaper model that
answers in its place when it cannot (its arm fails or is not there) and, from the fallback's
degradation level, before it is tried. Its answers are marked degraded, never cached as full
ones, counted, and named `<model>/fallback` in strata.stages; the later stages run after it.
A later stage's arms count in the per-arm figures, under `<pipeline>/<stage>`. Through the
real chain, with every service a process."""

import copy
import signal
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import yaml

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.default_system.test_stages import BUILD, logits
from tests.e2e.test_metrics import metrics_address, scrape, total
from tests.support.system import DEFAULT_CONFIG, running_system

TOKEN = "first-fallback-admin-token-of-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
CHEAP = {"name": "digits", "version": "2"}
LOST = [{"arm": "lost", "deployment": "b", "version": "9"}]  # a version no one serves
UNSURE = 0.8  # the default cascade's bound


def pipelines() -> dict:
    """`orphan`: digits whose only arm calls a version no one serves, with digits version 2
    as its fallback; `orphan-cascade`: the default cascade with the same first model;
    `leveled`: digits with version 2 as its fallback from level 2; `stranded`: digits whose
    only arm is deployment b, with version 1 on deployment a as its fallback."""
    served = yaml.safe_load(DEFAULT_CONFIG.read_text())["pipelines"]
    relaxed = {"latency_objective_ms": 60_000}  # the ladder stays where the test puts it
    orphan = copy.deepcopy(served["digits"])
    orphan["model"] = {"name": "digits", "routes": LOST}
    cascade = copy.deepcopy(served["digits-cascade"])
    cascade["model"] = {"name": "digits", "routes": LOST}
    leveled = copy.deepcopy(served["digits"])
    return {
        "orphan": {**orphan, **relaxed, "cache": True, "fallback": {"model": CHEAP}},
        "orphan-cascade": {**cascade, **relaxed, "fallback": {"model": CHEAP}},
        "leveled": {**leveled, **relaxed, "fallback": {"model": CHEAP, "from_level": 2}},
        "stranded": {
            **copy.deepcopy(served["digits"]),
            **relaxed,
            "model": {
                "name": "digits",
                "routes": [{"arm": "b", "deployment": "b", "version": "2"}],
            },
            "fallback": {"model": {"name": "digits", "version": "1"}},
        },
    }


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        "gateway": {"admin_token": TOKEN},
        "services": {"gateway": {"metrics": metrics_address()}},
        "pipelines": pipelines(),
    }
    with running_system(tmp_path_factory.mktemp("first-fallback"), changes) as supervisor:
        yield supervisor


def infer(stub, pipeline: str, images: np.ndarray, client: str = "anyone"):
    request = codec.build_request(pipeline, {"images": images})
    return stub.ModelInfer(request, timeout=30, metadata=(("x-client-id", client),))


def classes(reply: v2.ModelInferResponse) -> list[int]:
    return codec.response_outputs(reply)["labels"][:, 0].astype(int).tolist()


def images(rows: int) -> np.ndarray:
    return np.load(BUILD / "data" / "digits_test.npz")["images"][:rows]


def test_a_first_model_that_cannot_answer_falls_back_marked_degraded(stub) -> None:
    batch = images(4)
    for _ in range(2):  # the second is not the first's answer from the cache
        reply = infer(stub, "orphan", batch)
        parameters = reply.parameters
        assert parameters["strata.stages"].string_param == "digits/fallback"
        assert parameters["strata.degraded"].bool_param
        assert parameters["strata.degraded_source"].string_param == "fallback"
        assert not parameters["strata.cached"].bool_param
        assert parameters["strata.model_version"].string_param == "", "version 9 did not answer"
        assert classes(reply) == logits("digits", batch, "2").argmax(axis=1).tolist()


def test_the_later_stages_run_after_the_first_models_fallback(stub) -> None:
    data = images(64)
    small = logits("digits", data, "2")
    shifted = np.exp(small - small.max(axis=1, keepdims=True))
    unsure = (shifted / shifted.sum(axis=1, keepdims=True)).max(axis=1) < UNSURE
    assert unsure.any() and not unsure.all()
    expected = np.where(unsure, logits("digits-large", data).argmax(axis=1), small.argmax(axis=1))
    reply = infer(stub, "orphan-cascade", data)
    assert reply.parameters["strata.stages"].string_param == "digits/fallback,large"
    assert reply.parameters["strata.degraded_source"].string_param == "fallback"
    assert classes(reply) == expected.tolist()


def test_from_its_level_the_first_models_fallback_answers(stub, system: Supervisor) -> None:
    batch = images(3)
    full = infer(stub, "leveled", batch)
    assert "strata.stages" not in full.parameters, "a one-model pipeline as it always was"
    assert not full.parameters["strata.degraded"].bool_param
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=2), metadata=AUTH)
    try:
        cheap = infer(stub, "leveled", batch)
    finally:
        admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    assert cheap.parameters["strata.stages"].string_param == "digits/fallback"
    assert cheap.parameters["strata.degraded_source"].string_param == "fallback"
    assert classes(cheap) == logits("digits", batch, "2").argmax(axis=1).tolist()


def test_a_pipeline_whose_first_model_is_not_served_is_ready_on_its_fallback(stub) -> None:
    assert stub.ModelReady(v2.ModelReadyRequest(name="orphan"), timeout=10).ready


def test_fallbacks_and_stage_arms_are_counted(stub, system: Supervisor) -> None:
    before = scrape(system.settings.services.gateway.metrics)
    data = np.load(BUILD / "data" / "digits_test.npz")["images"][:64]
    infer(stub, "digits-cascade", data)  # some of these rows go on to digits-large
    infer(stub, "orphan", images(2), client="counted")
    after = scrape(system.settings.services.gateway.metrics)

    def grown(family: str, name: str, **labels: str) -> float:
        return total(after[family], name, **labels) - total(before[family], name, **labels)

    arms = ("strata_gateway_arm_requests", "strata_gateway_arm_requests_total")
    assert grown(*arms, pipeline="digits-cascade", code="OK") == 1
    assert grown(*arms, pipeline="digits-cascade/large", code="OK") == 1
    assert grown(*arms, pipeline="orphan/digits/fallback", code="OK") == 1
    degraded = ("strata_gateway_degraded_answers", "strata_gateway_degraded_answers_total")
    assert grown(*degraded, source="fallback") == 1


def test_the_admin_status_lists_each_later_model_with_its_arms(stub, system: Supervisor) -> None:
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    before = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["orphan-cascade"]
    infer(stub, "orphan-cascade", images(64))  # the fallback answers, then large for some rows
    status = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["orphan-cascade"]
    assert [(s.stage, s.model) for s in status.stages] == [
        ("digits/fallback", "digits"),
        ("large", "digits-large"),
    ]
    assert [a.arm for a in status.arms] == ["lost"]
    fallback, large = status.stages
    assert (fallback.arms[0].version, fallback.arms[0].breaker) == ("2", "closed")
    assert fallback.arms[0].requests == before.stages[0].arms[0].requests + 1
    assert large.arms[0].requests == before.stages[1].arms[0].requests + 1
    weighed = admin.SetWeights(
        admin_pb2.SetWeightsRequest(pipeline="orphan-cascade/large", weights={"a": 3}),
        metadata=AUTH,
    ).pipelines["orphan-cascade"]
    assert (weighed.stages[1].arms[0].weight, weighed.stages[1].arms[0].config_weight) == (3, 1)
    with pytest.raises(grpc.RpcError) as unknown:
        admin.SetWeights(
            admin_pb2.SetWeightsRequest(pipeline="orphan-cascade/nope", weights={"a": 1}),
            metadata=AUTH,
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'orphan-cascade/large'" in unknown.value.details()  # the stages that exist


def test_with_its_only_deployment_down_the_first_models_fallback_answers(
    stub, system: Supervisor
) -> None:
    """The arm's calls fail UNAVAILABLE until its circuit opens, then at once; no arm is
    left to fail over to, so the fallback answers every request. Last: it stops b."""
    batch = images(2)
    system.stop("inference-b", signal.SIGKILL)
    try:
        replies = [infer(stub, "stranded", batch, client=f"c{i}") for i in range(12)]
    finally:
        system.start("inference-b")
    expected = logits("digits", batch).argmax(axis=1).tolist()
    for reply in replies:
        assert reply.parameters["strata.stages"].string_param == "digits/fallback"
        assert reply.parameters["strata.degraded_source"].string_param == "fallback"
        assert classes(reply) == expected
