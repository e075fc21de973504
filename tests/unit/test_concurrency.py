"""The door's adaptive concurrency limit and per-client shares, on a fake clock."""

import pytest

from services.gateway.concurrency import AdaptiveLimit, Door
from strata.errors import Overloaded
from strata.policies import Concurrency

SETTINGS = Concurrency(initial=16, min_limit=2, max_limit=256, update_seconds=0.1, min_samples=4)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(limit: AdaptiveLimit, clock: Clock, latency: float, busy: int, updates: int) -> None:
    """`updates` update intervals with `busy` requests in flight, each taking `latency`."""
    for _ in range(updates):
        for i in range(busy):
            limit.enter(f"c{i}")
        clock.now += SETTINGS.update_seconds
        for i in range(busy):
            limit.leave(f"c{i}", latency)


def test_the_limit_grows_while_latency_holds_and_the_limit_is_used() -> None:
    clock = Clock()
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=clock)
    drive(limit, clock, 0.01, busy=16, updates=20)
    assert limit.limit > 30


def test_the_limit_does_not_grow_when_load_does_not_reach_it() -> None:
    clock = Clock()
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=clock)
    drive(limit, clock, 0.01, busy=4, updates=20)
    assert limit.limit == 16


def test_latency_rising_past_the_tolerance_shrinks_the_limit() -> None:
    clock = Clock()
    limit = AdaptiveLimit(SETTINGS, objective=10.0, clock=clock)
    drive(limit, clock, 0.01, busy=16, updates=5)
    grown = limit.limit
    drive(limit, clock, 0.08, busy=16, updates=10)
    assert limit.limit < grown / 2


def test_latency_past_the_objective_share_shrinks_it_even_once_the_baseline_follows() -> None:
    clock = Clock()
    limit = AdaptiveLimit(SETTINGS, objective=0.1, clock=clock)
    drive(limit, clock, 0.2, busy=16, updates=30)  # the baseline is 0.2 too: no gradient
    assert limit.limit < 8


def test_a_client_holding_its_share_under_contention_is_refused_and_others_are_not() -> None:
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=Clock())
    for _ in range(8):
        limit.enter("flood")
    limit.enter("quiet")
    assert limit.refusal("flood") == "client_share"  # 8 of 16, shared by 2
    assert limit.refusal("quiet") == ""
    assert limit.refusal("new") == ""


def test_a_lone_client_may_fill_the_limit_and_a_newcomer_still_gets_in() -> None:
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=Clock())
    for _ in range(16):
        assert limit.refusal("flood") == ""
        limit.enter("flood")
    assert limit.refusal("flood") == "concurrency"
    assert limit.refusal("newcomer") == ""
    limit.enter("newcomer")
    assert limit.refusal("flood") == "concurrency"
    for _ in range(8):
        limit.leave("flood", None)
    assert limit.refusal("flood") == "client_share", "8 of 16, shared by 2"
    assert limit.refusal("newcomer") == ""


def test_the_door_refuses_past_the_limit_with_a_retry_hint() -> None:
    door = Door(Concurrency(initial=2, min_limit=1, contention=1.0), {"digits": 1.0})
    tickets = [door.enter("digits", "c") for _ in range(2)]
    with pytest.raises(Overloaded) as refused:
        door.enter("digits", "c")
    assert "concurrency limit" in str(refused.value)
    assert dict(refused.value.trailers())["retry-after-ms"] == "1"
    door.enter("digits", "newcomer")  # its headroom
    door.leave(tickets[0], counts=True)
    with pytest.raises(Overloaded):
        door.enter("digits", "c")
    door.leave(tickets[1], counts=True)
    door.enter("digits", "c")
