"""Control of a running system, with real processes: model load and unload behind a token,
readiness and failover that follow what is loaded, reloads and weight changes applied whole
or refused whole, rate limits per peer, and ModelStatistics at the gateway."""

import math
import time
from collections.abc import Callable, Iterator

import grpc
import numpy as np
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import run_client, running_system

MODELS_TOKEN = "test-models-token-of-at-least-32-chars"
ADMIN_TOKEN = "test-admin-token-of-at-least-32-characters"
ADMIN = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
MODELS = (("authorization", f"Bearer {MODELS_TOKEN}"),)
IMAGE = np.zeros((1, 8, 8), np.uint8)
CLIENTS = [f"client-{i}" for i in range(40)]


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        "inference": {"admin_token": MODELS_TOKEN},
        "gateway": {"admin_token": ADMIN_TOKEN, "breaker": {"open_seconds": 0.5}},
    }
    with running_system(tmp_path_factory.mktemp("control"), changes) as supervisor:
        yield supervisor


def stub(system: Supervisor, name: str = "gateway") -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address(name)))


def admin(system: Supervisor) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))


def health(system: Supervisor, name: str, service: str) -> str:
    checker = health_pb2_grpc.HealthStub(grpc.insecure_channel(system.address(name)))
    reply = checker.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def digits(gateway, client: str) -> v2.ModelInferResponse:
    request = codec.build_request("digits", {"images": IMAGE})
    return gateway.ModelInfer(request, metadata=(("x-client-id", client),), timeout=10)


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def arm_of(reply: v2.ModelInferResponse) -> str:
    return reply.parameters["strata.arm"].string_param


def weights(system: Supervisor) -> dict[str, float]:
    status = admin(system).Status(admin_pb2.StatusRequest(), metadata=ADMIN, timeout=5)
    return {arm.arm: arm.weight for arm in status.pipelines["digits"].arms}


def reload_with(system: Supervisor, change: Callable[[dict], None]) -> admin_pb2.ReloadResponse:
    """Reload the config file as `change` edits it; the file is restored afterwards."""
    original = system.config.read_text()
    raw = yaml.safe_load(original)
    change(raw)
    system.config.write_text(yaml.safe_dump(raw))
    try:
        return admin(system).Reload(admin_pb2.ReloadRequest(), metadata=ADMIN, timeout=10)
    finally:
        system.config.write_text(original)


def test_unloading_a_model_needs_the_token_and_the_gateway_routes_around_it(system) -> None:
    inference = stub(system, "inference-a")
    unload = v2.RepositoryModelUnloadRequest(model_name="digits")
    load = v2.RepositoryModelLoadRequest(model_name="digits")
    refused = [
        code_of(lambda: inference.RepositoryModelUnload(unload, timeout=10)),
        code_of(lambda: inference.RepositoryModelLoad(load, timeout=10)),
    ]
    still = inference.ModelReady(v2.ModelReadyRequest(name="digits")).ready
    inference.RepositoryModelUnload(unload, metadata=MODELS, timeout=30)
    try:
        ready = inference.ServerReady(v2.ServerReadyRequest()).ready
        states = {
            s: health(system, "inference-a", s) for s in ("", "model/digits", "model/tabular")
        }
        gateway = stub(system)
        arms = [arm_of(digits(gateway, client)) for client in CLIENTS]
        tabular = [
            gateway.ModelInfer(
                codec.build_request("tabular", {"features": np.zeros((1, 30), np.float32)}),
                timeout=10,
            ).model_name
            for _ in range(10)
        ]
    finally:
        inference.RepositoryModelLoad(load, metadata=MODELS, timeout=60)
    back = (
        inference.ServerReady(v2.ServerReadyRequest()).ready,
        health(system, "inference-a", "model/digits"),
    )
    end = time.monotonic() + 15
    served_by_a = False
    while not served_by_a and time.monotonic() < end:
        served_by_a = "control" in {arm_of(digits(gateway, c)) for c in CLIENTS}
        time.sleep(0.2)
    assert refused == [grpc.StatusCode.UNAUTHENTICATED] * 2 and still
    assert not ready
    assert states == {"": "SERVING", "model/digits": "NOT_SERVING", "model/tabular": "SERVING"}
    assert arms == ["canary"] * len(CLIENTS), "every client answered, by the other arm"
    assert tabular == ["tabular"] * 10, "the deployment's other model kept serving"
    assert back == (True, "SERVING")
    assert served_by_a, "the control arm serves again once digits is back"


def test_a_reload_that_adds_a_pipeline_is_refused_whole(system) -> None:
    def add_pipeline(raw: dict) -> None:
        raw["pipelines"]["digits-copy"] = raw["pipelines"]["digits"]
        raw["pipelines"]["digits"]["model"]["routes"][0]["weight"] = 10  # applies live alone

    reply = reload_with(system, add_pipeline)
    unknown = code_of(lambda: stub(system).ModelInfer(codec.build_request("digits-copy", {})))
    assert list(reply.applied) == []
    assert list(reply.needs_restart) == ["pipelines.digits-copy"]
    assert weights(system) == {"control": 90, "canary": 10}, "nothing was applied"
    assert unknown == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize(
    ("weight", "code", "says"),
    [
        (-1, grpc.StatusCode.FAILED_PRECONDITION, "greater than or equal to 0"),  # invalid config
        (math.inf, grpc.StatusCode.FAILED_PRECONDITION, "finite number"),  # invalid config too
    ],
)
def test_a_reload_with_weights_that_are_invalid_is_refused_whole(
    system, weight, code, says
) -> None:
    def change(raw: dict) -> None:
        raw["gateway"]["cache"] = {"max_entries": 5}  # would apply live alone
        raw["pipelines"]["digits"]["model"]["routes"][1]["weight"] = weight

    with pytest.raises(grpc.RpcError) as info:
        reload_with(system, change)
    unchanged = reload_with(system, lambda raw: None)  # had the cache change applied, it would show
    assert info.value.code() == code and says in info.value.details()
    assert weights(system) == {"control": 90, "canary": 10}
    assert list(unchanged.applied) == [] and list(unchanged.needs_restart) == []


@pytest.mark.parametrize(
    "wanted",
    [
        {"canary": math.nan},
        {"canary": -1.0},
        {"canary": math.inf},
        {"control": 0.0, "canary": 0.0},
        {"nope": 5.0},
    ],
)
def test_set_weights_that_cannot_route_are_refused_and_change_nothing(system, wanted) -> None:
    request = admin_pb2.SetWeightsRequest(pipeline="digits", weights=wanted)
    with pytest.raises(grpc.RpcError) as info:
        admin(system).SetWeights(request, metadata=ADMIN, timeout=5)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert weights(system) == {"control": 90, "canary": 10}
    assert code_of(lambda: digits(stub(system), "after-refused-weights")) == grpc.StatusCode.OK


def test_rotating_client_ids_stays_limited_by_the_peer(system) -> None:
    # A peer: 1/s, 10 at once. Slow enough that 60 calls in a row outrun it however loaded the
    # machine (each would have to take a second for none to be refused).
    limits = {"per_client": {"rate": 0.2, "burst": 2}, "peer_clients": 5}
    applied = reload_with(system, lambda raw: raw["gateway"].update(rate_limits=limits)).applied
    gateway = stub(system)
    started = time.monotonic()
    try:
        outcomes = []
        for i in range(60):
            try:
                digits(gateway, f"rotating-{i}")
                outcomes.append("OK")
            except grpc.RpcError as exc:
                outcomes.append(f"{exc.code().name}: {exc.details()}")
        elapsed = time.monotonic() - started
    finally:
        restored = reload_with(system, lambda raw: None).applied
    admitted = outcomes.count("OK")
    refused = [o for o in outcomes if o != "OK"]
    assert list(applied) == ["gateway.rate_limits"] and list(restored) == ["gateway.rate_limits"]
    assert admitted <= 10 + 1 * elapsed + 1
    assert refused and all(o.startswith("RESOURCE_EXHAUSTED: rate limit (peer)") for o in refused)


def count(statistic: dict) -> int:
    return int(statistic.get("count", 0))


def test_model_statistics_at_the_gateway_count_the_requests(system) -> None:
    report = run_client("triton_statistics", system.address("gateway"), "tabular", "5", "2", "3")
    before, after = (report[k]["model_stats"][0] for k in ("before", "after"))
    stats = {
        key: count(after["inference_stats"].get(key, {}))
        - count(before["inference_stats"].get(key, {}))
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")
    }
    added = int(after.get("inference_count", 0)) - int(before.get("inference_count", 0))
    executed = int(after.get("execution_count", 0)) - int(before.get("execution_count", 0))
    assert report["codes"] == ["OK"] * 5 + ["StatusCode.INVALID_ARGUMENT"] * 2
    assert after["name"] == "tabular" and after["version"] == "1"
    assert stats == {
        "success": 5,
        "fail": 2,
        "queue": 5,
        "compute_input": 5,
        "compute_infer": 5,
        "compute_output": 5,
    }
    assert added == 15 and 1 <= executed <= 5
    infer = after["inference_stats"]
    assert int(infer["success"]["ns"]) >= int(infer["compute_infer"]["ns"]) > 0
    assert int(after["last_inference"]) > 0
    assert report["all"] == ["digits", "digits-cascade", "tabular"]
    assert report["unknown"]["status"] == "StatusCode.NOT_FOUND"


def version_stats(gateway, version: str) -> v2.ModelStatistics:
    request = v2.ModelStatisticsRequest(name="digits", version=version)
    (entry,) = gateway.ModelStatistics(request, timeout=5).model_stats
    return entry


def test_model_statistics_per_version_count_what_each_arm_answered(system) -> None:
    gateway = stub(system)
    before = {v: version_stats(gateway, v).inference_count for v in ("", "1", "2")}
    served = [digits(gateway, client).model_version for client in CLIENTS]
    after = {v: version_stats(gateway, v) for v in ("", "1", "2")}
    added = {v: after[v].inference_count - before[v] for v in after}
    assert set(served) == {"1", "2"}  # the control and canary arms both answered
    assert added == {"": 40, "1": served.count("1"), "2": served.count("2")}
    assert [after[v].version for v in ("", "1", "2")] == ["1", "1", "2"]
    with pytest.raises(grpc.RpcError) as refused:
        version_stats(gateway, "7")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "its arms serve versions: '1', '2'" in refused.value.details()
