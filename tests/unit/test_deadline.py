"""A request's deadline: one moment on time.monotonic(), and its form on the wire."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from strata.errors import DeadlineExceeded
from strata.wire.deadline import Deadline, earliest, latest


@pytest.mark.timing
def test_a_deadline_is_a_moment_on_the_monotonic_clock() -> None:
    before = time.monotonic()
    deadline = Deadline.after(2.0)
    assert before + 2.0 <= deadline.at <= time.monotonic() + 2.0
    assert 1.9 < deadline.left() <= 2.0
    assert not deadline.expired()


def test_a_passed_deadline_has_expired_and_no_time_left() -> None:
    deadline = Deadline.after(-0.001)
    assert deadline.expired()
    assert deadline.left() < 0
    with pytest.raises(DeadlineExceeded, match="deadline passed before preprocess"):
        deadline.remaining("preprocess")


def test_remaining_is_the_time_left_while_there_is_some() -> None:
    assert 0.9 < Deadline.after(1.0).remaining("inference") <= 1.0


def test_a_call_without_a_deadline_has_none() -> None:
    assert Deadline.within(None) is None
    deadline = Deadline.within(0.5)
    assert deadline is not None and 0.4 < deadline.left() <= 0.5


def test_the_wire_carries_the_microseconds_left_and_zero_means_none() -> None:
    assert Deadline.from_us(0) is None
    sent = Deadline.after(0.25)
    received = Deadline.from_us(sent.to_us())
    assert received is not None
    assert received.at == pytest.approx(sent.at, abs=0.005)


def test_a_passed_deadline_goes_on_the_wire_as_one_microsecond_not_as_none() -> None:
    assert Deadline.after(-1.0).to_us() == 1


def test_earliest_is_the_sooner_and_keeps_the_first_of_equals() -> None:
    soon, late, same = Deadline(1.0), Deadline(2.0), Deadline(1.0)
    assert earliest(None, None) is None
    assert earliest(soon, None) is soon
    assert earliest(None, late) is late
    assert earliest(late, soon) is soon
    assert earliest(soon, same) is soon
    assert earliest(same, soon) is same


def test_latest_is_the_last_of_several() -> None:
    deadlines = [Deadline(3.0), Deadline(7.0), Deadline(5.0)]
    assert latest(deadlines) is deadlines[1]


def test_a_deadline_is_immutable_and_ordered() -> None:
    deadline = Deadline(1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        deadline.at = 2.0  # type: ignore[misc]
    assert Deadline(1.0) < Deadline(2.0) and Deadline(1.0) == Deadline(1.0)


def test_asyncio_waits_on_the_same_clock() -> None:
    async def waited() -> float:
        deadline = Deadline.after(0.05)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(deadline.left()):
                await asyncio.sleep(5)
        return time.monotonic() - deadline.at

    late = asyncio.run(waited())
    assert 0 <= late < 0.5
