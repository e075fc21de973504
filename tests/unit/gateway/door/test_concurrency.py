"""The door's adaptive concurrency limit, per-client shares with their floor, and how its
refusals are counted and logged, on a fake clock."""

import asyncio
import functools
import logging
import time

import pytest
from prometheus_client import REGISTRY

from services.gateway.door.concurrency import AdaptiveLimit, AdaptiveLimits
from services.gateway.door.refusals import OTHER, Refusals
from strata.config.gateway import Concurrency, Ladder
from strata.errors import Overloaded
from tests.support.clock import Clock

SETTINGS = Concurrency(initial=16, min_limit=2, max_limit=256, update_seconds=0.1, min_samples=4)


def drive(limit: AdaptiveLimit, clock: Clock, latency: float, busy: int, updates: int) -> None:
    """`updates` update intervals with `busy` requests in flight, each taking `latency`."""
    for _ in range(updates):
        for i in range(busy):
            limit.enter(f"c{i}")
        clock.now += SETTINGS.update_seconds
        for i in range(busy):
            limit.leave(f"c{i}", latency)


def test_the_limit_grows_while_latency_holds_and_the_limit_is_used() -> None:
    clock = Clock(0.0)
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=clock)
    drive(limit, clock, 0.01, busy=16, updates=20)
    assert limit.limit > 30


def test_the_limit_does_not_grow_when_load_does_not_reach_it() -> None:
    clock = Clock(0.0)
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=clock)
    drive(limit, clock, 0.01, busy=4, updates=20)
    assert limit.limit == 16


def test_latency_rising_past_the_tolerance_shrinks_the_limit() -> None:
    clock = Clock(0.0)
    limit = AdaptiveLimit(SETTINGS, objective=10.0, clock=clock)
    drive(limit, clock, 0.01, busy=16, updates=5)
    grown = limit.limit
    drive(limit, clock, 0.08, busy=16, updates=10)
    assert limit.limit < grown / 2


def test_latency_past_the_objective_share_shrinks_it_even_once_the_baseline_follows() -> None:
    clock = Clock(0.0)
    limit = AdaptiveLimit(SETTINGS, objective=0.1, clock=clock)
    drive(limit, clock, 0.2, busy=16, updates=30)  # the baseline is 0.2 too: no gradient
    assert limit.limit < 8


def test_a_client_holding_its_share_under_contention_is_refused_and_others_are_not() -> None:
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=Clock(0.0))
    for _ in range(8):
        limit.enter("flood")
    limit.enter("quiet")
    assert limit.refusal("flood") == "client_share"  # 8 of 16, shared by 2
    assert limit.refusal("quiet") == ""
    assert limit.refusal("new") == ""


def test_a_lone_client_may_fill_the_limit_and_a_newcomer_still_gets_in() -> None:
    limit = AdaptiveLimit(SETTINGS, objective=1.0, clock=Clock(0.0))
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
    door = AdaptiveLimits(Concurrency(initial=2, min_limit=1, contention=1.0), {"digits": 1.0})
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


def synchronously(test):
    """An async test run to its end on a loop of its own."""
    return functools.wraps(test)(lambda: asyncio.run(test()))


def full_door(**settings: float) -> tuple[AdaptiveLimits, list]:
    """A door for `digits` (objective 1 s) with its one place taken."""
    door = AdaptiveLimits(
        Concurrency(initial=1, min_limit=1, contention=1.0, **settings), {"digits": 1.0}
    )
    return door, [door.enter("digits", "c")]


@synchronously
async def test_a_request_past_the_limit_waits_for_the_next_free_place() -> None:
    door, held = full_door(wait_share=0.5)
    waiting = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    assert not waiting.done()
    door.leave(held[0], counts=True)
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert door.limits["digits"].inflight == 1 and ticket.client == "c"


@synchronously
async def test_places_go_oldest_first_until_the_oldest_has_waited_half_its_patience() -> None:
    door, held = full_door(wait_share=1.0)  # patience 1 s: 0.4 s of margin at any load
    first = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    door.leave(held[0], counts=True)
    ticket = await asyncio.wait_for(first, 1.0)
    await asyncio.sleep(0.55)  # the queue backs up: past half the oldest's patience
    third = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    door.leave(ticket, counts=True)
    await asyncio.wait_for(third, 1.0)
    assert not second.done()
    second.cancel()


@pytest.mark.timing
@synchronously
async def test_a_request_waits_no_longer_than_its_share_of_the_objective_or_its_budget() -> None:
    door, _ = full_door(wait_share=0.05)
    started = time.monotonic()
    with pytest.raises(Overloaded, match="no place freed in time"):
        await door.admit("digits", "c", None, budget=10.0, waited=0.0)
    assert 0.04 < time.monotonic() - started < 0.5
    started = time.monotonic()
    with pytest.raises(Overloaded):
        await door.admit("digits", "c", None, budget=0.01, waited=0.0)
    assert time.monotonic() - started < 0.04
    assert door.limits["digits"].waiting == []


@synchronously
async def test_a_caller_gone_while_waiting_takes_no_place() -> None:
    door, held = full_door(wait_share=0.5)
    waiting = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    waiting.cancel()
    await asyncio.sleep(0)
    door.leave(held[0], counts=True)
    limit = door.limits["digits"]
    assert limit.inflight == 0 and limit.waiting == []


@synchronously
async def test_a_place_freed_before_a_gone_waiter_unwinds_goes_to_the_next_one() -> None:
    door, held = full_door(wait_share=0.5)
    gone = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    staying = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    gone.cancel()  # its place is cancelled now; its own clean-up runs later
    door.leave(held[0], counts=True)  # the answer that frees the place is not refused
    ticket = await asyncio.wait_for(staying, 1.0)
    with pytest.raises(asyncio.CancelledError):
        await gone
    limit = door.limits["digits"]
    assert limit.inflight == 1 and limit.holders == {"c": 1} and limit.waiting == []
    door.leave(ticket, counts=True)
    assert limit.inflight == 0 and limit.holders == {}


@synchronously
async def test_nothing_waits_while_shedding_or_once_the_queue_is_full() -> None:
    door, _ = full_door(wait_share=0.5, max_waiting=0)
    with pytest.raises(Overloaded, match="waiting"):
        await door.admit("digits", "c", None, budget=10.0, waited=0.0)
    door, _ = full_door(wait_share=0.5)
    with pytest.raises(Overloaded, match="shedding"):
        await door.admit("digits", "c", Ladder(), budget=10.0, waited=0.0)


@synchronously
async def test_a_caller_without_a_deadline_waits_past_the_objective_for_its_place() -> None:
    door, held = full_door(wait_share=0.05)  # patience 50 ms for a caller with a deadline
    waiting = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=None))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    door.leave(held[0], counts=True)
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert ticket.client == "c" and door.limits["digits"].queued == 0


@synchronously
async def test_callers_without_a_deadline_go_in_turn_after_those_with_one() -> None:
    door, held = full_door(wait_share=0.2)  # patience 200 ms
    calm = [
        asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=None))
        for _ in range(2)
    ]
    await asyncio.sleep(0.12)  # past half a deadline's patience: those go newest first
    hurried = asyncio.create_task(door.admit("digits", "c", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    door.leave(held[0], counts=True)
    ticket = await asyncio.wait_for(hurried, 1.0)
    assert not any(task.done() for task in calm)
    door.leave(ticket, counts=True)
    ticket = await asyncio.wait_for(calm[0], 1.0)
    assert not calm[1].done()
    door.leave(ticket, counts=True)
    door.leave(await asyncio.wait_for(calm[1], 1.0), counts=True)


@synchronously
async def test_callers_with_deadlines_go_first_only_within_their_clients_share() -> None:
    settings = Concurrency(initial=4, min_limit=1, contention=0.5, min_share=1, wait_share=1.0)
    door = AdaptiveLimits(settings, {"digits": 1.0})
    flood = [door.enter("digits", "flood") for _ in range(2)]
    calm = [door.enter("digits", "calm") for _ in range(2)]
    hurried = [
        asyncio.create_task(door.admit("digits", "flood", None, budget=10.0, waited=0.0))
        for _ in range(3)
    ]
    waiting = asyncio.create_task(door.admit("digits", "calm", None, budget=10.0, waited=None))
    await asyncio.sleep(0.01)
    door.leave(calm[0], counts=True)  # flood holds its share (2 of 4): calm's place is calm's
    ticket = await asyncio.wait_for(waiting, 1.0)
    assert ticket.client == "calm" and not any(task.done() for task in hurried)
    for task in hurried:
        task.cancel()
    for held in [*flood, calm[1], ticket]:
        door.leave(held, counts=True)


async def closed_loop(door: AdaptiveLimits, clients: int, rounds: int, waited: float | None) -> int:
    """`clients` callers each sending `rounds` requests one after another, each answered
    10 ms after it gets its place; how many the door refused."""

    async def caller() -> int:
        refused = 0
        for _ in range(rounds):
            try:
                ticket = await door.admit("digits", "c", None, budget=10.0, waited=waited)
            except Overloaded:
                refused += 1
                continue
            await asyncio.sleep(0.01)
            door.leave(ticket, counts=True)
        return refused

    return sum(await asyncio.gather(*(caller() for _ in range(clients))))


@synchronously
async def test_a_closed_loop_without_deadlines_is_never_refused_past_a_small_limit() -> None:
    """64 in flight through 4 places: each waits about 150 ms, three times its objective. A
    caller with a deadline is refused past its patience (an open loop's protection); one
    without would only send again at once."""
    settings = {"initial": 4, "max_limit": 4, "min_limit": 4, "wait_share": 1.0}
    door = AdaptiveLimits(Concurrency(**settings), {"digits": 0.05})
    assert await closed_loop(door, clients=64, rounds=5, waited=None) == 0
    assert door.limits["digits"].inflight == 0 and door.limits["digits"].queued == 0
    assert await closed_loop(door, clients=64, rounds=5, waited=0.0) > 0


def test_a_client_below_its_share_floor_is_not_refused_when_the_limit_shrinks() -> None:
    """The soak's refusal: three clients each hold 6 while the limit moves from 32 to 20; an
    equal share is then 6.7, so a seventh request was "over its share" below any fair one."""
    for floor, expected in ((1, "client_share"), (8, "")):
        settings = Concurrency(initial=32, min_limit=2, contention=0.5, min_share=floor)
        limit = AdaptiveLimit(settings, objective=1.0, clock=Clock(0.0))
        for client in ("a", "b", "c"):
            for _ in range(6):
                limit.enter(client)
        assert limit.refusal("a") == ""
        limit.limit = 20.0  # the adaptive limit moved
        assert limit.refusal("a") == expected, f"min_share {floor}"
    for _ in range(2):
        limit.enter("a")
    limit.limit = 24.0
    assert limit.refusal("a") == "client_share", "8, its floor and its equal share, is all"
    assert "this client holds its share (8 of 8; 20 of its limit of 24" in door_message(limit)


def door_message(limit: AdaptiveLimit) -> str:
    door = AdaptiveLimits(limit.settings, {"digits": 1.0})
    door.limits["digits"] = limit
    with pytest.raises(Overloaded) as refused:
        door.enter("digits", "a")
    return str(refused.value)


@synchronously
async def test_a_freed_place_goes_to_a_waiter_below_its_share_before_one_above() -> None:
    settings = Concurrency(initial=6, min_limit=1, contention=0.5, min_share=1, wait_share=0.5)
    door = AdaptiveLimits(settings, {"digits": 1.0})
    big = [door.enter("digits", "big") for _ in range(4)]
    small, kept = (door.enter("digits", "small") for _ in range(2))
    over = asyncio.create_task(door.admit("digits", "big", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    under = asyncio.create_task(door.admit("digits", "small", None, budget=10.0, waited=0.0))
    await asyncio.sleep(0.01)
    door.leave(small, counts=True)
    ticket = await asyncio.wait_for(under, 1.0)
    assert ticket.client == "small" and not over.done()
    for held in [*big, kept, ticket]:
        door.leave(held, counts=True)
    door.leave(await asyncio.wait_for(over, 1.0), counts=True)


def refused(reason: str, client: str) -> float:
    sample = REGISTRY.get_sample_value(
        "strata_gateway_refusals_total", {"reason": reason, "client": client}
    )
    return sample or 0.0


def test_every_refusal_is_counted_by_reason_and_a_bounded_client_label() -> None:
    refusals = Refusals(Concurrency(refusal_clients=2), clock=Clock(0.0))
    before = {c: refused("queue", c) for c in ("ra", "rb", "rc", OTHER)}
    for client in ("ra", "rb", "rc", "rd", "ra"):
        refusals.record("queue", client, "full")
    after = {c: refused("queue", c) - before[c] for c in before}
    assert after == {"ra": 2, "rb": 1, "rc": 0, OTHER: 2}
    assert refusals.label("x" * 1000) == OTHER


def test_refusals_are_logged_once_per_reason_per_interval_with_their_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock(0.0)
    refusals = Refusals(Concurrency(refusal_log_seconds=10), clock=clock)
    with caplog.at_level(logging.WARNING, logger="services.gateway.door.refusals"):
        for client in ("a", "a", "b", "a", "c", "d"):
            refusals.record("client_share", client, "pipeline 'digits': this client …")
            clock.now += 1
        refusals.record("waited", "a", "pipeline 'digits': no place freed in time …")
        clock.now += 5
        refusals.record("client_share", "e", "pipeline 'digits': the latest …")
    assert [r.getMessage() for r in caplog.records] == [
        "door refused 1 (client_share), by client: 'a' 1; latest: pipeline 'digits': this client …",
        "door refused 1 (waited), by client: 'a' 1; latest: pipeline 'digits': no place "
        "freed in time …",
        "door refused 6 (client_share) in the last 11 s, by client: 'a' 2, 'b' 1, 'c' 1, "
        "others 2; latest: pipeline 'digits': the latest …",
    ]


def test_the_door_counts_its_refusals_by_client() -> None:
    door = AdaptiveLimits(Concurrency(initial=1, min_limit=1, contention=1.0), {"digits": 1.0})
    before = refused("concurrency", "counted")
    door.enter("digits", "counted")
    door.enter("digits", "counted-newcomer")  # its headroom
    with pytest.raises(Overloaded):
        door.enter("digits", "counted")
    assert refused("concurrency", "counted") - before == 1


@synchronously
async def test_one_client_cannot_fill_the_queue_and_keep_the_next_client_out() -> None:
    door, held = full_door(max_waiting=8)
    held.append(door.enter("digits", "flood"))  # its newcomer's headroom taken too
    flood = [
        asyncio.create_task(door.admit("digits", "flood", None, budget=10.0, waited=None))
        for _ in range(8)
    ]
    await asyncio.sleep(0.01)
    refused = [task for task in flood if task.done()]
    assert len(refused) == 4  # its share: 8 / (1 client + room for one more)
    for task in refused:
        with pytest.raises(Overloaded, match="its share of the queue"):
            task.result()
    newcomer = asyncio.create_task(door.admit("digits", "calm", None, budget=10.0, waited=None))
    await asyncio.sleep(0.01)
    assert not newcomer.done()  # waiting for a place, not refused
    with pytest.raises(Overloaded, match="its share of the queue"):
        await door.admit("digits", "flood", None, budget=10.0, waited=None)
    for task in [*flood, newcomer]:
        task.cancel()
    await asyncio.gather(*flood, newcomer, return_exceptions=True)
    assert door.limits["digits"].waiters == {} and door.limits["digits"].queued == 0
    for ticket in held:
        door.leave(ticket, counts=True)


def test_the_door_tells_each_refusals_pipeline_and_reason() -> None:
    told: list[tuple[str, str]] = []
    settings = Concurrency(initial=1, min_limit=1, max_limit=1, contention=1.0)
    door = AdaptiveLimits(settings, {"digits": 1.0}, lambda *refusal: told.append(refusal))
    door.enter("digits", "c")
    door.enter("digits", "newcomer")  # its headroom
    with pytest.raises(Overloaded):
        door.enter("digits", "c")
    assert told == [("digits", "concurrency")]
