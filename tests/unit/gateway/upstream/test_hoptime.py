"""Hop timeouts follow the hop's recent P99 for the work a call carries (its rows, its bytes,
and the calls the hop still owes), within their floor and ceiling."""

import numpy as np
import pytest

from services.gateway.upstream.hoptime import HopTimer, Load
from strata.config.gateway import HopTimeouts
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec

SETTINGS = HopTimeouts(multiplier=5, floor_seconds=0.05, window=64, min_samples=32)
PHOTO = Load("images", rows=1, bytes=50_000)


def timeout(timer: HopTimer, load: Load) -> float:
    timing = timer.begin(load)
    timer.end(timing)
    return timing.timeout


def learned(seconds: float, load: Load = PHOTO, calls: int = 64) -> HopTimer:
    timer = HopTimer(SETTINGS, ceiling=10.0)
    for _ in range(calls):
        timer.observe(seconds, load)
    return timer


def test_the_ceiling_holds_until_enough_calls_are_seen() -> None:
    assert timeout(learned(0.02, calls=31), PHOTO) == 10.0


def test_the_timeout_is_a_multiple_of_the_recent_p99_within_its_bounds() -> None:
    timer = learned(0.02)
    assert timeout(timer, PHOTO) == pytest.approx(0.1)
    for _ in range(64):
        timer.observe(0.001, PHOTO)
    assert timeout(timer, PHOTO) == pytest.approx(0.05), "never under the floor"
    for _ in range(64):
        timer.observe(5.0, PHOTO)
    assert timeout(timer, PHOTO) == 10.0, "never over the ceiling"


def test_a_flight_of_many_rows_gets_the_time_its_rows_take() -> None:
    timer = learned(0.02)  # one photo a call
    assert timeout(timer, Load("images", rows=16, bytes=16 * 50_000)) == pytest.approx(1.6)


def test_a_call_of_more_bytes_than_usual_gets_their_time() -> None:
    timer = learned(0.02)
    assert timeout(timer, Load("images", rows=1, bytes=500_000)) == pytest.approx(1.0)


def test_a_big_flight_does_not_shorten_a_small_calls_timeout_below_its_own_p99() -> None:
    timer = learned(0.32, Load("images", rows=64, bytes=64 * 50_000))  # 5 ms a row
    assert timeout(timer, PHOTO) == pytest.approx(5 * 0.32)


def test_each_kind_of_call_is_timed_apart() -> None:
    timer = learned(0.02)
    for _ in range(64):
        timer.observe(0.0001, Load("digits", rows=1, bytes=784))
    assert timeout(timer, Load("images", rows=16, bytes=16 * 50_000)) == pytest.approx(1.6)
    assert timeout(timer, Load("text", rows=1, bytes=100)) == 10.0, "not seen yet: the ceiling"


def test_a_call_waits_its_turn_behind_the_calls_the_hop_still_owes() -> None:
    timer = learned(0.02)
    flight = timer.begin(Load("images", rows=16, bytes=16 * 50_000))
    assert timeout(timer, PHOTO) == pytest.approx(5 * (16 + 1) * 0.02)
    timer.end(flight)
    assert timeout(timer, PHOTO) == pytest.approx(0.1)


def test_a_retry_waits_at_least_what_it_is_given_within_the_ceiling() -> None:
    timer = learned(0.02)
    timing = timer.begin(PHOTO, at_least=0.2)  # a retry after a missed 0.1 s: twice as long
    timer.end(timing)
    assert timing.timeout == pytest.approx(0.2)
    assert timer.begin(PHOTO, at_least=0.01).timeout == pytest.approx(0.1), "never shorter"
    assert timer.begin(PHOTO, at_least=60.0).timeout == 10.0, "never over the ceiling"


def test_a_call_no_one_else_could_answer_gets_the_ceiling() -> None:
    timer = learned(0.02)
    timing = timer.begin(PHOTO, bounded=False)
    assert timing.timeout == 10.0


def test_a_process_call_carries_its_members_rows_and_its_tensors_bytes() -> None:
    tensor = codec.to_tensor("image", np.zeros((3, 8), np.uint8))
    item = v1.Request(pipeline="images", tensors=[tensor])
    item.members.add(id="a", rows=1)
    item.members.add(id="b", rows=2)
    assert Load.of(v1.ProcessRequest(requests=[item])) == Load("images", rows=3, bytes=24)


def test_a_model_call_carries_its_rows_and_its_inputs_bytes() -> None:
    """Fixed-width inputs are sized by their shapes, strings by their encoded bytes."""
    request = v2.ModelInferRequest(model_name="digits")
    request.inputs.add(name="x", datatype="FP32", shape=[4, 64])
    request.raw_input_contents.append(bytes(4 * 64 * 4))
    request.inputs.add(name="s", datatype="BYTES", shape=[4, 1])
    request.raw_input_contents.append(codec.to_raw(np.array([[b"ab"]] * 4, dtype=object)))
    assert Load.of(request) == Load("digits", rows=4, bytes=4 * 64 * 4 + 4 * (4 + 2))


def test_where_a_replica_holds_few_messages_calls_stuck_elsewhere_do_not_stretch_a_timeout() -> (
    None
):
    """Twenty calls stuck at a hung replica: a hop whose replicas are each sent at most two
    messages at once gives the next call two calls' worth, not twenty-one."""
    held, unbounded = learned(0.02), learned(0.02)
    held.held = 2
    for timer in (held, unbounded):
        for _ in range(20):
            timer.begin(PHOTO)  # never answered
    assert timeout(held, PHOTO) == pytest.approx(5 * 0.02 * 2)
    assert timeout(unbounded, PHOTO) == pytest.approx(5 * 0.02 * 21)
