"""The gateway in front of real layers, in process: validation, limits, ladder, A/B, deadlines.

A fault-injecting hop (tests/support/faulty.py) stands in front of an inference deployment
where a test needs it slow, failing or answering differently.
"""

import contextlib
import re
import threading
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
import yaml
from prometheus_client import REGISTRY

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.wire import codec
from tests.support.faulty import FaultyInference
from tests.support.inprocess import InProcess, servers_in_process
from tests.support.system import endpoint, free_port

TOKEN = "test-admin-token-of-at-least-32-characters"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
DIGIT = np.zeros((1, 8, 8), np.uint8)


def faulty_deployment(name: str) -> tuple[dict, str]:
    """Config for deployment `name` reached through a fault-injecting hop; its address."""
    proxy = f"127.0.0.1:{free_port()}"
    return {**endpoint(), "target": proxy}, proxy


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    a, proxy_a = faulty_deployment("a")
    b, proxy_b = faulty_deployment("b")
    changes = {
        "services": {"inference": {"a": a, "b": b}},
        "gateway": {
            "admin_token": TOKEN,
            "rate_limits": {"per_client": {"rate": 20, "burst": 5}},
            "ladder": {
                "tick_seconds": 0.05,
                "up_after": 2,
                "down_after": 6,
                "window_seconds": 1.0,
            },
            "concurrency": {"initial": 16, "min_limit": 16, "max_limit": 16},
            # Slow arms here drive the ladder; hop timeouts would eject them (test_faults).
            "hop_timeouts": {"floor_seconds": 5},
            "breaker": {"failures": 3, "open_seconds": 60},
        },
        "pipelines": {
            "digits": {
                "latency_objective_ms": 1000,
                "model": {
                    "name": "digits",
                    "routes": [
                        {"arm": "control", "deployment": "a", "weight": 70},
                        {"arm": "canary", "deployment": "b", "weight": 30},
                    ],
                    "shadow": {"deployment": "b"},
                },
            },
            "text": {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1], "utf8": True}],
                "outputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}],
                # Only the gateway's UTF-8 check is tested, which no request passes: a
                # version no repository holds, so no model's signature is checked against it.
                "model": {"name": "tabular", "version": "999"},
            },
        },
    }
    proxies = {}

    def add_proxies(world: InProcess) -> None:
        for name, address, deployment in (("a", proxy_a, a), ("b", proxy_b, b)):
            proxies[name] = FaultyInference(deployment["listen"])
            world.add_server(
                [
                    (
                        proxies[name],
                        grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
                        "inference.GRPCInferenceService",
                    )
                ],
                address,
            )

    with servers_in_process(tmp_path_factory.mktemp("gw"), changes, add_proxies) as world:
        world.proxies = proxies
        yield world


@pytest.fixture
def gateway(world: InProcess) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(world.settings.services.gateway.listen)
    )


@pytest.fixture
def admin(world: InProcess) -> admin_pb2_grpc.AdminStub:
    return admin_pb2_grpc.AdminStub(grpc.insecure_channel(world.settings.services.gateway.listen))


@pytest.fixture(autouse=True)
def healthy(world: InProcess, admin) -> Iterator[None]:
    """Each test starts and leaves with healthy deployments and the ladder back at 0."""
    yield
    for proxy in world.proxies.values():
        proxy.delay, proxy.fail, proxy.alter, proxy.malform = 0.0, None, False, False
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=0), metadata=AUTH)
    admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)


def infer(stub, client: str, timeout: float = 10, image: np.ndarray = DIGIT, **params):
    request = codec.build_request("digits", {"images": image})
    for key, value in params.items():
        request.parameters[key].string_param = value
    return stub.ModelInfer(request, metadata=(("x-client-id", client),), timeout=timeout)


def upstream_calls(admin) -> float:
    counters = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).counters
    return sum(v for k, v in counters.items() if k.startswith("upstream_calls."))


def bad_requests() -> dict[str, tuple[str, v2.ModelInferRequest]]:
    def digits(array: np.ndarray) -> v2.ModelInferRequest:
        return codec.build_request("digits", {"images": array})

    mismatch = digits(DIGIT)
    mismatch.raw_input_contents[0] = b"\x00" * 10
    nan = codec.build_request("tabular", {"features": np.full((1, 30), np.inf, np.float32)})
    text = codec.build_request("text", {"text": np.array([b"\xff\xfe"], dtype=object)})
    return {
        "datatype": ("FP32, expected UINT8", digits(DIGIT.astype(np.float32))),
        "rank": ("rank 2", digits(DIGIT.reshape(1, 64))),
        "dimension limit": ("allowed 1..512", digits(np.zeros((1, 600, 8), np.uint8))),
        "batch limit": ("dimension 0 is 65, allowed 1..64", digits(np.zeros((65, 8, 8), "u1"))),
        "byte size": ("needs 64 bytes, got 10", mismatch),
        "finite": ("NaN or infinite", nan),
        "utf8": ("not valid UTF-8", text),
        "unknown input": ("unknown input 'x'", codec.build_request("digits", {"x": DIGIT})),
    }


@pytest.mark.parametrize("case", list(bad_requests()))
def test_each_validation_rule_refuses_without_any_upstream_call(gateway, admin, case) -> None:
    words, request = bad_requests()[case]
    before = upstream_calls(admin)
    with pytest.raises(grpc.RpcError) as info:
        gateway.ModelInfer(request, metadata=(("x-client-id", f"v-{case}"),))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in info.value.details()
    assert upstream_calls(admin) == before


@pytest.mark.timing
def test_a_flooding_client_is_limited_and_a_polite_one_is_not(gateway) -> None:
    results = {"flood": [], "polite": []}
    stop = threading.Event()

    def flood() -> None:
        while not stop.is_set():
            try:
                infer(gateway, "flood")
                results["flood"].append("OK")
            except grpc.RpcError as exc:
                results["flood"].append(exc.code().name)
                assert dict(exc.trailing_metadata())["retry-after-ms"]

    def polite() -> None:
        for _ in range(10):
            try:
                infer(gateway, "polite")
                results["polite"].append("OK")
            except grpc.RpcError as exc:
                results["polite"].append(exc.code().name)
            time.sleep(0.2)

    workers = [threading.Thread(target=flood) for _ in range(3)]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    polite()
    stop.set()
    for worker in workers:
        worker.join()
    elapsed = time.monotonic() - started
    assert results["polite"] == ["OK"] * 10
    admitted = results["flood"].count("OK")
    # The bucket admits at most its rate plus its burst; a client slowed down by a loaded
    # machine may leave some of those tokens unused, never take more.
    allowed = 20 * elapsed + 5
    assert 0.8 * allowed <= admitted <= 1.05 * allowed
    assert set(results["flood"]) == {"OK", "RESOURCE_EXHAUSTED"}


def level_changes() -> float:
    value = REGISTRY.get_sample_value(
        "strata_gateway_degradation_changes_total", {"direction": "up"}
    )
    return value or 0.0


def wait_for_level(admin, wanted, seconds: float = 10) -> int:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        status = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH)
        if wanted(status.level):
            return status.level
        time.sleep(0.05)
    return status.level


def reload_with(world: InProcess, admin, change) -> list[str]:
    """Apply `change` to the config file's YAML and reload it live: what was applied."""
    path = world.settings.source
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw))
    reply = admin.Reload(admin_pb2.ReloadRequest(), metadata=AUTH)
    assert list(reply.needs_restart) == []
    return list(reply.applied)


def set_objective(world: InProcess, admin, milliseconds: float) -> list[str]:
    """Change the digits latency objective in the config file and reload it live."""

    def change(raw: dict) -> None:
        raw["pipelines"]["digits"]["latency_objective_ms"] = milliseconds

    return reload_with(world, admin, change)


def shared_requests() -> float:
    """Requests the gateway's flights carried beyond one per flight."""
    total = REGISTRY.get_sample_value("strata_gateway_flight_requests_sum") or 0.0
    return total - (REGISTRY.get_sample_value("strata_gateway_flight_requests_count") or 0.0)


def test_concurrent_requests_share_flights_and_each_gets_its_own_answer(
    world, gateway, admin
) -> None:
    images = [np.full((1, 8, 8), 7 * i, np.uint8) for i in range(12)]
    arm = {"strata.arm": "control"}  # the same model version for every answer
    alone = [infer(gateway, f"alone-{i}", image=image, **arm) for i, image in enumerate(images)]
    before = shared_requests()
    original = world.settings.source.read_text()
    applied = reload_with(
        world,
        admin,
        lambda raw: raw["gateway"].update(
            flights={"max_in_air": 1, "max_requests": 8}, upstream_timeout_seconds=5
        ),
    )
    together: dict[int, v2.ModelInferResponse] = {}

    def one(i: int) -> None:
        together[i] = infer(gateway, f"together-{i}", image=images[i], **arm)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(images))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        world.settings.source.write_text(original)
        admin.Reload(admin_pb2.ReloadRequest(), metadata=AUTH)
    assert applied == ["gateway.flights", "gateway.upstream_timeout_seconds"]
    assert shared_requests() > before, "no flight carried two requests"
    for i, answer in enumerate(alone):
        assert together[i].raw_output_contents == answer.raw_output_contents


@pytest.mark.timing
def test_slow_inference_drives_the_ladder_up_and_back_down(world, gateway, admin) -> None:
    assert set_objective(world, admin, 150) == ["pipelines.digits.latency_objective_ms"]
    for proxy in world.proxies.values():
        proxy.delay = 0.5
    before = level_changes()
    stop = threading.Event()
    answers = []

    def load(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                reply = infer(gateway, f"ladder-{i}-{n}")
                answers.append(reply.parameters["strata.level"].int64_param)
            except grpc.RpcError as exc:
                answers.append(exc.code().name)
                hint = dict(exc.trailing_metadata() or ()).get("retry-after-ms")
                if hint:  # as a well-behaved client does: no storm of refused calls
                    time.sleep(min(1.0, int(hint) / 1000))

    # 24 callers for the door's 16 places: past capacity, the door refuses the excess once
    # it has waited the objective (overload), and latency counts. Four callers, within the
    # places, are a closed loop at capacity: their slow answers move no level.
    workers = [threading.Thread(target=load, args=(i,)) for i in range(24)]
    for worker in workers:
        worker.start()
    reached = wait_for_level(admin, lambda level: level >= 2)
    for proxy in world.proxies.values():
        proxy.delay = 0.0
    settled = wait_for_level(admin, lambda level: level == 0)
    stop.set()
    for worker in workers:
        worker.join()
    set_objective(world, admin, 1000)
    assert reached >= 2 and settled == 0
    assert level_changes() >= before + 2
    assert any(isinstance(a, int) and a >= 1 for a in answers)


def test_level_three_answers_from_the_cache_marked_degraded(gateway, admin) -> None:
    """Answers are kept on the ladder's climb (from `keep_from_level`, 1), not while calm: a
    calm gateway hashes no request for a lookup that cannot come."""
    calm = infer(gateway, "calm-client")
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=2), metadata=AUTH)
    try:
        fresh = infer(gateway, "cache-client")
        admin.ForceLevel(admin_pb2.ForceLevelRequest(level=3), metadata=AUTH)
        cached = infer(gateway, "cache-client")
        unkept = infer(gateway, "calm-client")
    finally:
        admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    assert not calm.parameters["strata.cached"].bool_param
    assert not unkept.parameters["strata.cached"].bool_param, "no answer kept at level 0"
    assert not fresh.parameters["strata.degraded"].bool_param
    assert cached.parameters["strata.degraded"].bool_param
    assert cached.parameters["strata.degraded_source"].string_param == "cache"
    assert cached.raw_output_contents == fresh.raw_output_contents


def test_level_four_admits_a_few_and_sheds_the_rest_with_a_retry_hint(
    world, gateway, admin
) -> None:
    world.proxies["a"].delay = world.proxies["b"].delay = 2.0
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=4), metadata=AUTH)
    outcomes, hints = [], []

    def one(i: int) -> None:
        try:
            infer(gateway, f"shed-{i}", image=np.full((1, 8, 8), 100 + i, np.uint8))  # uncached
            outcomes.append("OK")
        except grpc.RpcError as exc:
            outcomes.append(exc.code().name)
            hints.append(int(dict(exc.trailing_metadata())["retry-after-ms"]))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    admitted = outcomes.count("OK")
    assert 1 <= admitted <= 6  # a quarter of the limit of 16, and 2 of headroom for newcomers
    assert outcomes.count("RESOURCE_EXHAUSTED") == 12 - admitted
    assert hints and all(hint > 0 for hint in hints)


def test_clients_stick_to_an_arm_and_a_forced_arm_wins(gateway) -> None:
    arms = {}
    for i in range(60):
        replies = [infer(gateway, f"sticky-{i}") for _ in range(2)]
        seen = {r.parameters["strata.arm"].string_param for r in replies}
        assert len(seen) == 1
        arms[i] = seen.pop()
    assert set(arms.values()) == {"control", "canary"}
    forced = infer(gateway, "sticky-0", **{"strata.arm": "canary"})
    assert forced.parameters["strata.arm"].string_param == "canary"


def test_the_shadow_never_changes_a_response(world, gateway, admin) -> None:
    baseline = infer(gateway, "shadow-0", **{"strata.arm": "control"})
    world.proxies["b"].alter = True  # the shadow (deployment b) now disagrees
    before = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["digits"].shadow
    replies = [infer(gateway, f"shadow-{i}", **{"strata.arm": "control"}) for i in range(1, 6)]
    end = time.monotonic() + 5
    while time.monotonic() < end:
        after = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["digits"].shadow
        if after.compared - before.compared >= 5:
            break
        time.sleep(0.05)
    assert all(r.raw_output_contents == baseline.raw_output_contents for r in replies)
    assert after.compared - before.compared >= 5
    assert after.agreed == before.agreed


def test_weight_change_under_load_drops_nothing(gateway, admin) -> None:
    errors, stop = [], threading.Event()

    def load(i: int) -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                infer(gateway, f"w-{i}-{n}")
            except grpc.RpcError as exc:
                errors.append(exc.code())

    workers = [threading.Thread(target=load, args=(i,)) for i in range(3)]
    for worker in workers:
        worker.start()
    time.sleep(0.3)
    status = admin.SetWeights(
        admin_pb2.SetWeightsRequest(pipeline="digits", weights={"control": 0, "canary": 1}),
        metadata=AUTH,
    )
    time.sleep(0.3)
    stop.set()
    for worker in workers:
        worker.join()
    arms = {infer(gateway, f"after-{i}").parameters["strata.arm"].string_param for i in range(20)}
    admin.SetWeights(
        admin_pb2.SetWeightsRequest(pipeline="digits", weights={"control": 70, "canary": 30}),
        metadata=AUTH,
    )
    assert errors == []
    assert {a.arm: a.weight for a in status.pipelines["digits"].arms} == {
        "control": 0,
        "canary": 1,
    }
    assert arms == {"canary"}


def test_a_short_deadline_is_answered_without_later_work(world, gateway, admin) -> None:
    world.proxies["a"].delay = world.proxies["b"].delay = 0.3
    counters = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).counters
    before = counters.get("upstream_calls.postprocess", 0)
    with pytest.raises(grpc.RpcError) as info:
        infer(gateway, "deadline-client", timeout=0.1)
    time.sleep(0.4)
    after = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).counters
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert after.get("upstream_calls.postprocess", 0) == before


def test_a_failing_arm_opens_its_breaker_and_traffic_falls_back(world, gateway, admin) -> None:
    world.proxies["b"].fail = grpc.StatusCode.UNAVAILABLE
    for i in range(12):
        with contextlib.suppress(grpc.RpcError):
            infer(gateway, f"breaker-{i}", **{"strata.arm": "canary"})
    status = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).pipelines["digits"]
    assert {a.arm: a.breaker for a in status.arms}["canary"] == "open"
    arms = {
        infer(gateway, f"fallback-{i}").parameters["strata.arm"].string_param for i in range(40)
    }
    assert arms == {"control"}


def test_a_malformed_inference_reply_is_internal_and_names_the_deployment(world, gateway) -> None:
    world.proxies["a"].malform = world.proxies["b"].malform = True
    with pytest.raises(grpc.RpcError) as caught:
        infer(gateway, "malformed")
    assert caught.value.code() == grpc.StatusCode.INTERNAL  # never the client's INVALID_ARGUMENT
    assert "answered a malformed reply: output " in caught.value.details()
    assert re.search(r"inference deployment '[ab]'", caught.value.details())
    world.proxies["a"].malform = world.proxies["b"].malform = False
    assert infer(gateway, "malformed").outputs  # the gateway serves on


def test_admin_needs_the_token(admin) -> None:
    with pytest.raises(grpc.RpcError) as info:
        admin.Status(admin_pb2.StatusRequest())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as info:
        admin.Status(admin_pb2.StatusRequest(), metadata=(("authorization", "Bearer nope"),))
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_repository_control_names_the_setting_the_gateway_lacks(gateway) -> None:
    """Here only the gateway has an admin token: the caller's is right, the config is not."""
    calls = (
        (gateway.RepositoryIndex, v2.RepositoryIndexRequest()),
        (gateway.RepositoryModelUnload, v2.RepositoryModelUnloadRequest(model_name="digits")),
    )
    for call, request in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call(request, metadata=AUTH)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "inference.admin_token" in refused.value.details()
    with pytest.raises(grpc.RpcError) as refused:
        gateway.RepositoryIndex(v2.RepositoryIndexRequest())
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
