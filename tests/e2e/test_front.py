"""The HAProxy front (deploy/front/haproxy.cfg) before a real gateway: an ordinary client
passes through it unrefused, what the front refuses reaches a gRPC client as
RESOURCE_EXHAUSTED with a retry hint, not as HTTP's 503, a flood is refused on arrival,
not after the queue's wait, a front sized from a capacity holds no more calls in the
gateway and its queue than its sizing says, and the gateway's health service is reached
outside the places. Skipped without haproxy."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.front import FrontSettings, counters, front, haproxy
from strata.errors import RETRY_AFTER
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import free_port, run_client, running_system

pytestmark = pytest.mark.skipif(haproxy() is None, reason="haproxy is not installed")

# Long enough that 256 calls in flight wait in the front and at the door on a busy machine
# (about 500 answers/s: half a second), so that nothing is refused for its wait here; the
# refusal's shape is the other test's.
PATIENT = FrontSettings(places=64, queue_ms=5000)
# One place and a wait shorter than any answer: calls sent at once are refused by the front.
NARROW = FrontSettings(places=1, queue_ms=1)
# A few places, a long wait and a rate that bounds the queue at 4/s x 3 s = 12: what a burst
# brings past the places and those 12 is refused on arrival; the admitted ones never see the
# wait out, since the gateway answers hundreds a second even on a busy machine.
FLOODED = FrontSettings(places=8, queue_ms=3000, rate=4)
# Sized for a gateway of 250 answers/s and a 250 ms objective: 13 places (a fifth of the
# objective at that rate, rounded up) and a queue bounded at 250/s x 12 ms = 3 calls.
SIZED = FrontSettings.sized(250, 0.25)


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    def changes() -> dict:
        return {
            "pipelines": {"digits": {"latency_objective_ms": 5000}},
            "services": {"gateway": {"metrics": f"127.0.0.1:{free_port()}"}},
        }

    with running_system(tmp_path_factory.mktemp("front"), changes) as supervisor:
        yield supervisor


def readyz(supervisor: Supervisor) -> str:
    return supervisor.settings.services.gateway.metrics


# Timing: its calls wait up to PATIENT.queue_ms at the front, which a loaded machine outlasts.
@pytest.mark.timing
@pytest.mark.parametrize("in_flight", [64, 256])
def test_tritonclient_through_the_front_sees_no_error(system: Supervisor, in_flight: int) -> None:
    calls = 3
    with front(system.address("gateway"), readyz(system), PATIENT) as address:
        codes = run_client("triton_concurrent", address, "digits", str(in_flight), str(calls))
    assert codes == {"OK": calls * in_flight}


def digits_request():
    return codec.build_request("digits", {"images": np.zeros((1, 8, 8), np.uint8)})


async def at_once(address: str, calls: int) -> tuple[collections.Counter, float]:
    """`calls` digits requests at once on one connection: answers, each refusal by its
    code and retry hint, and the seconds the slowest refusal took."""
    codes: collections.Counter = collections.Counter()
    refusals = [0.0]
    async with grpc.aio.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        request = digits_request()

        async def call() -> None:
            started = time.monotonic()
            try:
                await stub.ModelInfer(request, timeout=30)
                codes["OK"] += 1
            except grpc.aio.AioRpcError as exc:
                refusals.append(time.monotonic() - started)
                hint = dict(exc.trailing_metadata() or ()).get(RETRY_AFTER)
                codes[(exc.code(), hint)] += 1

        await asyncio.gather(*(call() for _ in range(calls)))
    return codes, max(refusals)


def test_a_refusal_by_the_front_is_resource_exhausted_with_a_retry_hint(
    system: Supervisor,
) -> None:
    calls = 64
    with front(system.address("gateway"), readyz(system), NARROW) as address:
        codes, _ = asyncio.run(at_once(address, calls))
    refused = codes.pop((grpc.StatusCode.RESOURCE_EXHAUSTED, "100"), 0)
    assert refused > 0, f"the front refused nothing: {dict(codes)}"
    assert set(codes) <= {"OK"}, f"other answers than refusals with a hint: {dict(codes)}"
    assert codes["OK"] >= 1, "the front's one place answered nothing"


def test_a_flood_on_one_connection_is_refused_on_arrival_and_the_rest_answered(
    system: Supervisor,
) -> None:
    # As many calls at once as one connection to the front may hold, far past its places
    # and its queue's bound: a refusal after the queue's wait would hold each of their
    # streams for 3 s; on arrival it takes no more than the burst takes to send.
    calls = 256
    metrics = f"127.0.0.1:{free_port()}"
    with front(system.address("gateway"), readyz(system), FLOODED, metrics) as address:
        codes, slowest = asyncio.run(at_once(address, calls))
        counted = counters(metrics)
    refused = codes.pop((grpc.StatusCode.RESOURCE_EXHAUSTED, "100"), 0)
    # Counted by reason: every refusal here was on arrival, none after the queue's wait.
    assert counted["haproxy_backend_requests_denied_total"] == refused, counted
    assert counted["haproxy_backend_connection_errors_total"] == 0, counted
    # Past the places and the queue (20 calls), only what the gateway answers while the burst
    # is still arriving gets in (236 refused, the burst sent in 0.1-0.2 s at load average 24).
    assert refused > calls // 4, f"the front let the flood in: {refused} refused, {dict(codes)}"
    assert set(codes) <= {"OK"}, f"other answers than refusals with a hint: {dict(codes)}"
    assert codes["OK"] >= FLOODED.places, f"the admitted calls were not answered: {dict(codes)}"
    # Wide margin: half the queue's wait, where a refusal on arrival takes milliseconds.
    wait = FLOODED.queue_ms / 1e3
    assert slowest < wait / 2, f"a refusal took {slowest:.2f} s: it waited in the queue"


def test_a_sized_front_holds_its_places_in_the_gateway_and_its_bound_in_the_queue(
    system: Supervisor,
) -> None:
    calls = 64
    metrics = f"127.0.0.1:{free_port()}"
    with front(system.address("gateway"), readyz(system), SIZED, metrics) as address:
        codes, _ = asyncio.run(at_once(address, calls))
        counted = counters(metrics)
    refused = codes.pop((grpc.StatusCode.RESOURCE_EXHAUSTED, "100"), 0)
    assert set(codes) <= {"OK"}, f"other answers than refusals with a hint: {dict(codes)}"
    assert codes["OK"] >= SIZED.places and refused > 0, dict(codes)
    # What the sizing set is what HAProxy enforced: never more calls in the gateway at once
    # than its places, never more queued than the rate clears within the wait. The places
    # count calls, not connections: one client connection held more than one of them.
    assert counted["haproxy_server_limit_sessions"] == SIZED.places, counted
    assert 1 < counted["haproxy_server_max_sessions"] <= SIZED.places, counted
    assert counted["haproxy_backend_max_queue"] <= SIZED.rate * SIZED.queue_ms / 1000, counted


async def called_while_watched(address: str, calls: int) -> tuple[int, list[str]]:
    """A health Watch opened through the front and held while `calls` digits requests are
    made one after another: the status it first reads, and each call's outcome."""
    outcomes = []
    async with grpc.aio.insecure_channel(address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
        first = await watch.read()
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(calls):
            try:
                await stub.ModelInfer(digits_request(), timeout=30)
                outcomes.append("OK")
            except grpc.aio.AioRpcError as exc:
                outcomes.append(exc.code().name)
        watch.cancel()
    return first.status, outcomes


def test_a_health_watch_through_the_front_holds_none_of_its_places(system: Supervisor) -> None:
    # NARROW has one place and a 1 ms queue: were the Watch, which lasts as long as its
    # client, to take that place, every call after it would be refused.
    with front(system.address("gateway"), readyz(system), NARROW) as address:
        status, outcomes = asyncio.run(called_while_watched(address, 3))
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert outcomes == ["OK"] * 3
