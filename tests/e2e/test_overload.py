"""Overload at the gateway, with real processes: refusals are fast, distinct and hinted, and
the ladder follows queueing delay up and back down without giving up full answers."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from strata import codec
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from tests.support.system import running_system

TOKEN = "overload-admin"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def image(i: int) -> np.ndarray:
    return np.full((1, 8, 8), i % 256, np.uint8)


def call(stub, client: str, i: int) -> tuple[str, float, str]:
    """(code, seconds, retry-after-ms or "") of one digits request."""
    started = time.perf_counter()
    request = codec.build_request("digits", {"images": image(i)})
    try:
        stub.ModelInfer(request, metadata=(("x-client-id", client),), timeout=10)
        return "OK", time.perf_counter() - started, ""
    except grpc.RpcError as exc:
        hint = dict(exc.trailing_metadata() or ()).get("retry-after-ms", "")
        return exc.code().name, time.perf_counter() - started, hint


def stubs(address: str, count: int) -> list[v2_grpc.GRPCInferenceServiceStub]:
    """Stubs on `count` connections of their own: the gateway takes 16 calls at once per
    connection (server.public_max_concurrent_streams), as a client pool would spread them."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(address, options=options) for _ in range(count)]
    return [v2_grpc.GRPCInferenceServiceStub(channel) for channel in channels]


def burst(address: str, count: int, clients: int = 1) -> list[tuple[str, float, str]]:
    pool_of = stubs(address, 4)
    with ThreadPoolExecutor(32) as pool:
        return list(pool.map(lambda i: call(pool_of[i % 4], f"c{i % clients}", i), range(count)))


def test_beyond_its_concurrency_limit_the_gateway_refuses_at_once_with_a_hint(
    tmp_path: Path,
) -> None:
    fixed = {"initial": 2, "min_limit": 2, "max_limit": 2, "wait_share": 0}
    with running_system(tmp_path, {"gateway": {"concurrency": fixed}}) as system:
        outcomes = burst(system.address("gateway"), 300, clients=64)
    served = sorted(s for code, s, _ in outcomes if code == "OK")
    refused = [(s, hint) for code, s, hint in outcomes if code == "RESOURCE_EXHAUSTED"]
    assert served and refused, {code for code, _, _ in outcomes}
    assert {code for code, _, _ in outcomes} == {"OK", "RESOURCE_EXHAUSTED"}
    assert all(int(hint) >= 1 for _, hint in refused)
    refusal = float(np.median([s for s, _ in refused]))
    assert refusal < float(np.median(served)), "a refusal costs less than an answer"


def test_requests_beyond_the_limit_wait_for_a_place_instead_of_being_refused(
    tmp_path: Path,
) -> None:
    fixed = {"initial": 2, "min_limit": 2, "max_limit": 2, "wait_share": 1.0}
    with running_system(tmp_path, {"gateway": {"concurrency": fixed}}) as system:
        address = system.address("gateway")
        pool_of = stubs(address, 2)
        with ThreadPoolExecutor(8) as pool:
            outcomes = list(pool.map(lambda i: call(pool_of[i % 2], "c", i), range(200)))
    assert {code for code, _, _ in outcomes} == {"OK"}, "8 at once, 2 places: the rest wait"


def test_a_full_inference_queue_refusal_carries_its_hint_through_the_gateway(
    tmp_path: Path,
) -> None:
    changes = {
        "inference": {
            "batching": {"max_queue_rows": 1, "policy": "fixed", "max_queue_delay_ms": 20}
        },
        "gateway": {"flights": {"max_in_air": 1}},
    }
    with running_system(tmp_path, changes) as system:
        outcomes = burst(system.address("gateway"), 200, clients=200)
    full = [hint for code, _, hint in outcomes if code == "RESOURCE_EXHAUSTED"]
    assert full, "a flight of many met a queue of one row"
    assert all(int(hint) >= 1 for hint in full)


@pytest.fixture
def admin_system(tmp_path: Path):
    changes = {
        "gateway": {
            "admin_token": TOKEN,
            "flights": {"max_in_air": 1},
            "ladder": {
                "queue_delay_share": 0.001,  # 0.25 ms of the 250 ms objective: any queue
                "tick_seconds": 0.05,
                "window_seconds": 0.5,
                "up_after": 1,
                "down_after": 4,
            },
        },
        "pipelines": {"digits": {"latency_objective_ms": 250}},
    }
    with running_system(tmp_path, changes) as system:
        yield system


def test_the_ladder_climbs_on_queueing_delay_says_why_and_comes_back_down(admin_system) -> None:
    address = admin_system.address("gateway")
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(address))
    admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    stop, levels, reasons, readings = threading.Event(), [], [], {}

    def watch() -> None:
        while not stop.is_set():
            status = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH)
            levels.append(status.level)
            if status.level:
                reasons.append(status.level_reason)
                readings.update(status.signals)
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcomes = burst(address, 600, clients=32)
    finally:
        time.sleep(0.1)
    calm = time.monotonic() + 10
    while time.monotonic() < calm and levels[-1] != 0:
        time.sleep(0.05)
    stop.set()
    watcher.join()
    assert {code for code, _, _ in outcomes} <= {"OK", "RESOURCE_EXHAUSTED"}
    assert max(levels) >= 1 and levels[-1] == 0
    assert max(levels) <= 2, "queueing alone never gives up full answers"
    assert any(r.startswith("queue_delay:digits") and "against" in r for r in reasons), reasons
    assert readings["queue_delay:digits"].threshold == pytest.approx(0.00025)
    calmed = admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).level_reason
    assert calmed.startswith("calm"), calmed


def test_a_flooding_client_cannot_take_another_clients_share(tmp_path: Path) -> None:
    changes = {"gateway": {"concurrency": {"initial": 8, "min_limit": 8, "max_limit": 8}}}
    with running_system(tmp_path, changes) as system:
        flooding, quiet_stub = (
            stubs(system.address("gateway"), 4),
            stubs(system.address("gateway"), 1)[0],
        )
        stop, flooded = threading.Event(), []

        def flood(worker: int) -> None:
            i = worker
            while not stop.is_set():
                flooded.append(call(flooding[worker % 4], "flood", i))
                i += 32

        floods = [threading.Thread(target=flood, args=(w,)) for w in range(32)]
        for thread in floods:
            thread.start()
        try:
            time.sleep(0.5)
            quiet = [call(quiet_stub, "quiet", i)[0] for i in range(40)]
        finally:
            stop.set()
            for thread in floods:
                thread.join()
    assert quiet == ["OK"] * 40
    assert {code for code, _, _ in flooded} == {"OK", "RESOURCE_EXHAUSTED"}
