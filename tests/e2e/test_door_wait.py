"""The wait before the door on a real gateway: its own probe gives the reading once a pipeline
has calls, and no client's deadlines, however mixed, move the level that every client shares
(issue 47: 1 s calls, one 30 s call, then 1 s calls again took the ladder to level 2)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.wire import codec
from tests.support.system import running_system

# They assert a quiet gateway's reading and level: run alone, as the readings are the machine's.
pytestmark = pytest.mark.timing

TOKEN = "door-wait-admin-token-of-at-least-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SIGNAL = "door_wait:digits"
REQUEST = codec.build_request("digits", {"images": np.zeros((1, 8, 8), np.uint8)})
CHANGES = {
    "gateway": {"admin_token": TOKEN, "ladder": {"tick_seconds": 0.1}},
    "pipelines": {"digits": {"latency_objective_ms": 250}},
}


@contextmanager
def gateway(folder: Path) -> Iterator[str]:
    with running_system(folder, CHANGES) as system:
        yield system.address("gateway")


def status(address: str) -> admin_pb2.StatusResponse:
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(address))
    return admin.Status(admin_pb2.StatusRequest(), metadata=AUTH)


def call(address: str, client: str, timeouts: list[float | None]) -> list[bool]:
    """One call after another from `client`, each with its timeout (None: no deadline);
    whether each answer came back degraded."""
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
    metadata = (("x-client-id", client),)
    answers = [stub.ModelInfer(REQUEST, metadata=metadata, timeout=t) for t in timeouts]
    return [answer.parameters["strata.degraded"].bool_param for answer in answers]


def level_moves(folder: Path) -> list[str]:
    """The gateway's log lines of level moves (WARNING, each with its signal)."""
    log = (folder / "gateway.log").read_text(errors="replace")
    return [line for line in log.splitlines() if "degradation level" in line]


def test_calls_give_the_probe_a_reading_far_below_its_threshold(tmp_path: Path) -> None:
    with gateway(tmp_path) as address:
        time.sleep(0.5)  # probes, but no call of the pipeline yet
        assert SIGNAL not in status(address).signals
        call(address, "door", [None] * 30)  # with or without a deadline: the gateway measures
        time.sleep(0.3)  # a tick or more: the readings are the last tick's
        reading = status(address).signals[SIGNAL]
    assert reading.threshold == pytest.approx(0.25)  # the whole objective, by default
    # Each probe on a quiet gateway takes a millisecond or so; half the threshold is a margin
    # no stall of a busy machine has come near for the median of a second's probes.
    assert 0 <= reading.value < 0.5 * reading.threshold


def test_one_clients_long_deadline_between_short_ones_moves_no_level(tmp_path: Path) -> None:
    # The scenario: 1 s calls, then one 30 s call, then 1 s calls again.
    with gateway(tmp_path) as address:
        degraded = call(address, "mixed", [1.0] * 100 + [30.0] + [1.0] * 100)
        time.sleep(0.5)  # the ladder's ticks after the last call
        final = status(address)
    assert not any(degraded)
    assert final.level == 0
    assert level_moves(tmp_path) == []
    assert final.signals[SIGNAL].value < final.signals[SIGNAL].threshold


def test_several_clients_mixing_deadlines_at_once_move_no_level(tmp_path: Path) -> None:
    # Each client its own mix, the shortest first or the longest first, all at the same time.
    mixes = {
        "short-first": [1.0, 1.0, 30.0, 1.0, 5.0] * 20,
        "long-first": [30.0, 2.0, 2.0, 0.5, None] * 20,
        "alternating": [5.0, 1.0] * 50,
        "none-then-some": [None] * 50 + [10.0, 1.0] * 25,
    }
    degraded: dict[str, list[bool]] = {}
    with gateway(tmp_path) as address:

        def run(client: str) -> None:
            degraded[client] = call(address, client, mixes[client])

        threads = [threading.Thread(target=run, args=(client,)) for client in mixes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(0.5)
        final = status(address)
    assert sorted(degraded) == sorted(mixes)  # every client's calls were all answered
    assert not any(flag for flags in degraded.values() for flag in flags)
    assert final.level == 0
    assert level_moves(tmp_path) == []
