"""The wait before the door reaches the ladder from real gRPC calls: those with a deadline."""

import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from strata import codec
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from tests.support.system import running_system

# The wait it reads is the machine's: run alone.
pytestmark = pytest.mark.timing

TOKEN = "door-wait-admin-token-of-at-least-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SIGNAL = "door_wait:digits"


def readings_after(address: str, timeout: float | None) -> dict:
    """The ladder's readings once a few dozen calls with `timeout` (None: no deadline) have
    been answered, read within the signal's window."""
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(address))
    request = codec.build_request("digits", {"images": np.zeros((1, 8, 8), np.uint8)})
    for _ in range(30):
        stub.ModelInfer(request, metadata=(("x-client-id", "door"),), timeout=timeout)
    time.sleep(0.3)  # a tick or more: the readings are the last tick's
    return dict(admin.Status(admin_pb2.StatusRequest(), metadata=AUTH).signals)


def test_calls_with_a_deadline_give_a_reading_and_calls_without_give_none(
    tmp_path: Path,
) -> None:
    changes = {
        "gateway": {
            "admin_token": TOKEN,
            "ladder": {"door_window_seconds": 3.0, "tick_seconds": 0.1},
        },
        "pipelines": {"digits": {"latency_objective_ms": 250}},
    }
    with running_system(tmp_path, changes) as system:
        address = system.address("gateway")
        assert SIGNAL not in readings_after(address, None)
        reading = readings_after(address, 10.0)[SIGNAL]
    assert reading.threshold == pytest.approx(0.25)  # the whole objective, by default
    # One client, calls one after another on a quiet gateway: none waited long.
    assert 0 <= reading.value < 0.1
