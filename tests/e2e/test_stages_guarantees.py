"""What each request keeps at every stage of a pipeline of several models, through the real
chain: its own arm and error (a stage arm that fails fails only the requests on it, in the
same flights as requests that are answered), and its own deadline (a stage is not started
for a request whose budget is shorter than the stage's usual time: at a conditional stage it
leaves with the earlier model's answer, marked degraded and never cached; at any other stage
it fails DEADLINE_EXCEEDED naming the stage). A stage's fallback model answers, marked
degraded, where the stage's own cannot, and from its degradation level."""

import copy
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import pytest
import yaml

from services.gateway.upstream.router import Router
from strata.config.pipelines import Route
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.default_system.test_stages import BUILD, cascade, logits
from tests.support.system import DEFAULT_CONFIG, running_system

WINDOW_MS = 300  # every model call waits this long for a fuller batch
TOKEN = "stages-admin-token-of-at-least-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
FALLBACK = {"model": {"name": "digits", "version": "2"}, "from_level": 2}
ARMS = [
    {"arm": "good", "deployment": "a", "weight": 1},
    {"arm": "missing", "deployment": "b", "version": "9", "weight": 1},
]


def pipelines() -> dict:
    """The default cascade, slowed by the batching window, and a chain that always runs
    digits-large on one of two arms, one of which calls a version no one serves."""
    served = yaml.safe_load(DEFAULT_CONFIG.read_text())["pipelines"]["digits-cascade"]
    chained = copy.deepcopy(served)
    stage = chained["stages"][0]
    del stage["when"]
    stage["model"]["routes"] = ARMS
    # Objectives the window cannot breach: the ladder stays at level 0.
    relaxed = {"latency_objective_ms": 60_000}
    covered = copy.deepcopy(served)
    covered["stages"][0]["fallback"] = FALLBACK
    broken = copy.deepcopy(chained)
    broken["stages"][0]["model"]["routes"] = ARMS[1:]
    broken["stages"][0]["fallback"] = FALLBACK
    unready = copy.deepcopy(broken)
    del unready["stages"][0]["fallback"]
    fanned = copy.deepcopy(served)
    fanned["stages"] = [
        {**stage, "outputs": {"logits": "large_logits"}},
        {
            "name": "canary",
            "model": {"name": "digits", "version": "2"},
            "inputs": {"pixels": "pixels"},
            "outputs": {"logits": "canary_logits"},
            "parallel": True,
        },
    ]
    merge = {"kind": "mean", "inputs": ["logits", "large_logits", "canary_logits"]}
    fanned["postprocess"] = [{**merge, "output": "logits"}, *served["postprocess"]]
    return {
        "fanned": {**fanned, **relaxed},
        "slow-cascade": {**served, **relaxed, "cache": True},
        "chained": {**chained, **relaxed},
        "covered-cascade": {**covered, **relaxed, "cache": True},
        "broken-chain": {**broken, **relaxed, "cache": True},
        "unready-chain": {**unready, **relaxed},
    }


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        "gateway": {"admin_token": TOKEN},
        "inference": {"batching": {"policy": "fixed", "max_queue_delay_ms": WINDOW_MS}},
        "pipelines": pipelines(),
    }
    with running_system(tmp_path_factory.mktemp("stages"), changes) as supervisor:
        yield supervisor


def infer(stub, pipeline: str, images: np.ndarray, client: str, timeout: float = 30):
    request = codec.build_request(pipeline, {"images": images})
    return stub.ModelInfer(request, timeout=timeout, metadata=(("x-client-id", client),))


def test_a_failing_stage_arm_fails_only_the_requests_on_it(stub) -> None:
    clients = [f"client-{i}" for i in range(12)]
    arms = {client: _arm(client) for client in clients}
    assert set(arms.values()) == {"good", "missing"}
    images = np.load(BUILD / "data" / "digits_test.npz")["images"][:1]

    def call(client: str):
        try:
            return infer(stub, "chained", images, client)
        except grpc.RpcError as exc:
            return exc

    with ThreadPoolExecutor(len(clients)) as pool:  # together: they share flights
        outcomes = dict(zip(clients, pool.map(call, clients), strict=True))
    for client, outcome in outcomes.items():
        if arms[client] == "good":
            assert outcome.parameters["strata.stages"].string_param == "digits,large"
        else:
            assert isinstance(outcome, grpc.RpcError), client
            assert outcome.code() == grpc.StatusCode.NOT_FOUND
            assert "9" in outcome.details()


def test_a_request_that_cannot_wait_for_a_conditional_stage_exits_early(stub) -> None:
    data = np.load(BUILD / "data" / "digits_test.npz")
    _, unsure = cascade(data["images"])
    row = int(np.flatnonzero(unsure)[0])
    images = data["images"][row : row + 1]
    slow = infer(stub, "slow-cascade", images, "patient")  # teaches the stage its usual time
    assert slow.parameters["strata.stages"].string_param == "digits,large"
    assert not slow.parameters["strata.degraded"].bool_param
    # A budget that covers the first model's window but not the stage's as well.
    hurried = infer(stub, "slow-cascade", images, "hurried", timeout=1.6 * WINDOW_MS / 1000)
    assert hurried.parameters["strata.stages"].string_param == "digits"
    assert hurried.parameters["strata.degraded"].bool_param
    assert hurried.parameters["strata.degraded_source"].string_param == "early_exit"
    answered = int(codec.response_outputs(hurried)["labels"][0, 0])
    assert answered == logits("digits", images).argmax(axis=1)[0], "digits' own answer"
    again = infer(stub, "slow-cascade", images, "hurried")
    assert not again.parameters["strata.cached"].bool_param, "an early exit is never cached"
    cached = infer(stub, "slow-cascade", images, "hurried")
    assert cached.parameters["strata.cached"].bool_param
    assert cached.parameters["strata.stages"].string_param == "digits,large"


def test_a_request_that_cannot_wait_for_a_stage_fails_naming_it(stub) -> None:
    images = np.load(BUILD / "data" / "digits_test.npz")["images"][:1]
    good = next(c for c in (f"c{i}" for i in range(50)) if _arm(c) == "good")
    infer(stub, "chained", images, good)  # teaches the stage its usual time
    with pytest.raises(grpc.RpcError) as failed:
        infer(stub, "chained", images, good, timeout=1.6 * WINDOW_MS / 1000)
    assert failed.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "stage 'large' usually takes" in failed.value.details()


def _arm(client: str) -> str:
    """The stage arm the gateway gives a client sending `x-client-id: client`."""
    router = Router("chained/large", [Route(**arm) for arm in ARMS], None)
    return router.choose(f"id:{client}").arm


def test_a_stage_whose_model_cannot_answer_falls_back_marked_degraded(stub) -> None:
    images = np.load(BUILD / "data" / "digits_test.npz")["images"][:4]
    for _ in range(2):  # the second is not the first's answer from the cache
        reply = infer(stub, "broken-chain", images, "anyone")
        assert reply.parameters["strata.stages"].string_param == "digits,large/fallback"
        assert reply.parameters["strata.degraded"].bool_param
        assert reply.parameters["strata.degraded_source"].string_param == "fallback"
        assert not reply.parameters["strata.cached"].bool_param
        answered = codec.response_outputs(reply)["labels"][:, 0].astype(int)
        assert answered.tolist() == logits("digits", images, "2").argmax(axis=1).tolist()


def test_from_its_level_a_stage_runs_its_fallback(stub, system: Supervisor) -> None:
    data = np.load(BUILD / "data" / "digits_test.npz")
    _, unsure = cascade(data["images"])
    rows = np.flatnonzero(unsure)[:2]
    images = data["images"][rows]
    full = infer(stub, "covered-cascade", images, "leveled")
    assert full.parameters["strata.stages"].string_param == "digits,large"
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=2), metadata=AUTH)
    try:
        cheap = infer(stub, "covered-cascade", images, "another")  # not the cached answer
    finally:
        admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    assert cheap.parameters["strata.stages"].string_param == "digits,large/fallback"
    assert cheap.parameters["strata.degraded_source"].string_param == "fallback"
    answered = codec.response_outputs(cheap)["labels"][:, 0].astype(int)
    assert answered.tolist() == logits("digits", images, "2").argmax(axis=1).tolist()


def test_stages_side_by_side_merge_by_a_rule(stub) -> None:
    images = np.load(BUILD / "data" / "digits_test.npz")["images"][:8]
    reply = infer(stub, "fanned", images, "anyone")
    assert reply.parameters["strata.stages"].string_param == "digits,large,canary"
    each = [logits("digits", images), logits("digits-large", images), logits("digits", images, "2")]
    expected = np.mean(each, axis=0).argmax(axis=1)
    answered = codec.response_outputs(reply)["labels"][:, 0].astype(int)
    assert answered.tolist() == expected.tolist()


def test_a_pipeline_is_ready_when_every_stage_has_a_model_ready(stub) -> None:
    def ready(name: str) -> bool:
        return stub.ModelReady(v2.ModelReadyRequest(name=name), timeout=10).ready

    assert ready("chained"), "one of its stage's arms serves"
    assert ready("broken-chain"), "its stage's fallback serves"
    assert not ready("unready-chain"), "no arm of its stage serves version 9"
