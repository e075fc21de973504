"""The wait before the door as the probe reads it (services/gateway/door/backlog.py), the door
refusing on arrival while it is too long, and the door's own wait shortened by it, on a fake
clock."""

import asyncio

import pytest
from prometheus_client import REGISTRY

from services.gateway.door.backlog import QUEUE_CALLS, Arrivals, Backlog, BacklogLimit
from services.gateway.door.concurrency import AdaptiveLimits
from services.gateway.door.policy import Entry
from services.gateway.request import Caller
from strata.config.gateway import Concurrency
from strata.errors import Overloaded
from strata.process.runqueue import RunQueue
from strata.wire.deadline import Deadline
from tests.support.clock import Clock


def unstalled() -> float:  # a loop's thread that never waits for a CPU
    return 0.0


def answered(backlog: Backlog, *waits: float) -> None:
    for seconds in waits:
        backlog.sent()
        backlog.answered(seconds)


def test_the_wait_is_the_last_probes_less_the_loops_lag_where_the_kernel_says_nothing() -> None:
    lag = [0.0]
    backlog = Backlog(lambda: lag[0], clock=Clock(0.0), runqueue=lambda: None)
    backlog.sent()
    assert backlog.answered(0.3) == pytest.approx(0.3)
    lag[0] = 0.2  # a stall of the whole machine delays the probe without any call queued
    backlog.sent()
    assert backlog.answered(0.25) == pytest.approx(0.05)
    backlog.sent()
    assert backlog.answered(0.1) == 0.0, "never below nothing"


def test_the_loop_threads_waits_for_a_cpu_are_the_machines_unless_a_queue_came_in() -> None:
    queued = [5.0]  # seconds the loop's thread has waited runnable, since it started
    clock = Clock(0.0)
    backlog = Backlog(lambda: 0.1, clock=clock, runqueue=lambda: queued[0])
    backlog.sent()
    queued[0] += 0.2  # a machine short of cores kept the loop off a CPU for 0.2 s of it
    backlog.arrived()  # while a trickle's one call came
    assert backlog.answered(0.25) == pytest.approx(0.05), "the run queue's wait, not the lag"
    backlog.sent()
    queued[0] += 0.2
    for _ in range(QUEUE_CALLS):  # past capacity on a shared machine: calls kept coming
        backlog.arrived()
    assert backlog.answered(0.3) == pytest.approx(0.2), "less the loop's lag alone"
    backlog.sent()
    clock.now += 0.4
    queued[0] += 0.35  # the probe in flight: what it waited so far, less its stall so far
    assert backlog.wait() == pytest.approx(0.05)


def test_the_run_queue_is_read_from_linux_for_the_thread_that_reads_it_first() -> None:
    runqueue = RunQueue()
    try:
        first = runqueue()
        sum(range(10**5))
        assert first is not None and first >= 0.0
        assert runqueue() >= first, "a count since the thread started"
    finally:
        runqueue.close()
    assert RunQueue("/nonexistent/schedstat")() is None, "no schedstat: nothing said"


def test_a_queue_stands_when_two_probes_in_a_row_wait_one_late_probe_moves_nothing() -> None:
    backlog = Backlog(lambda: 0.0, clock=Clock(0.0), runqueue=unstalled)
    answered(backlog, 0.01, 0.4)
    assert backlog.wait() == pytest.approx(0.01)
    answered(backlog, 0.3)
    assert backlog.wait() == pytest.approx(0.3)
    answered(backlog, 0.002)
    assert backlog.wait() == pytest.approx(0.002), "drained: the door stops refusing at once"


def test_a_probe_still_in_flight_reads_at_least_as_long_as_it_has_waited() -> None:
    clock = Clock(0.0)
    backlog = Backlog(lambda: 0.0, clock=clock, runqueue=unstalled)
    answered(backlog, 0.01, 0.01)
    backlog.sent()
    clock.now += 0.4  # a queue building up shows before the probe comes back
    assert backlog.wait() == pytest.approx(0.4)
    backlog.lost()  # the server went away: the probe tells nothing more
    assert backlog.wait() == pytest.approx(0.01)


def entry(deadline: float | None, pipeline: str = "digits", client: str = "id:c") -> Entry:
    caller = Caller({}, "ipv4:127.0.0.1:5000", deadline)
    return Entry(caller, pipeline, client, "", Deadline.after(deadline or 30.0))


def policy(share: float, waited: float) -> tuple[BacklogLimit, list[str]]:
    """The policy for `digits` (objective 1 s) with calls waiting `waited` s before the door;
    the pipelines whose arrivals it told the ladder of."""
    backlog = Backlog(lambda: 0.0, clock=Clock(0.0), runqueue=unstalled)
    answered(backlog, waited, waited)
    limits = AdaptiveLimits(Concurrency(backlog_share=share), {"digits": 1.0})
    arrived: list[str] = []
    return BacklogLimit(backlog, limits, arrived.append), arrived


def refusals(reason: str) -> float:
    return REGISTRY.get_sample_value("strata_gateway_shed_total", {"reason": reason}) or 0.0


def test_a_call_with_a_deadline_is_refused_on_arrival_while_calls_wait_too_long() -> None:
    door, arrived = policy(share=0.25, waited=0.4)
    before = refusals("backlog")
    message = "waiting 400 ms before the gateway's door, more than 250 ms of its 1000 ms"
    with pytest.raises(Overloaded, match=message) as refused:
        asyncio.run(door.admit(entry(deadline=1.0)))
    assert refused.value.code.name == "RESOURCE_EXHAUSTED"
    assert refused.value.retry_after == pytest.approx(0.4), "retry once the queue has drained"
    assert refusals("backlog") == before + 1
    assert arrived == ["digits"], "the ladder counts the call it did not see arrive"


def test_the_backlog_refuses_nothing_within_its_share_without_a_deadline_or_turned_off() -> None:
    within, _ = policy(share=0.5, waited=0.4)
    assert asyncio.run(within.admit(entry(deadline=1.0))) is None
    long_wait, arrived = policy(share=0.25, waited=0.4)
    # A caller without a deadline sends again at once: a refusal would buy nothing.
    assert asyncio.run(long_wait.admit(entry(deadline=None))) is None
    assert asyncio.run(long_wait.admit(entry(deadline=1.0, pipeline="unknown"))) is None
    off, _ = policy(share=0.0, waited=5.0)
    assert asyncio.run(off.admit(entry(deadline=1.0))) is None
    assert arrived == []


def test_the_doors_own_wait_leaves_room_for_the_wait_before_it() -> None:
    """A call that waited out its objective before the door does not wait at the door too."""
    door = AdaptiveLimits(Concurrency(initial=1, min_limit=1, contention=1.0), {"digits": 1.0})
    door.enter("digits", "c")

    async def admitted(waited: float | None) -> None:
        await door.admit("digits", "c", None, budget=10.0, waited=waited)

    with pytest.raises(Overloaded, match="at its concurrency limit"):
        asyncio.run(asyncio.wait_for(admitted(waited=1.0), timeout=5.0))
    assert door.limits["digits"].queued == 0, "refused at once, never queued"


def test_a_client_sending_a_small_share_of_the_calls_is_not_refused_for_the_others_queue() -> None:
    door, arrived = policy(share=0.25, waited=0.4)
    for _ in range(50):
        with pytest.raises(Overloaded):
            asyncio.run(door.admit(entry(deadline=1.0, client="id:flood")))
    assert asyncio.run(door.admit(entry(deadline=1.0, client="id:polite"))) is None
    assert arrived == ["digits"] * 50, "only the flood's calls were refused"


def test_arrivals_share_out_among_the_clients_of_the_last_two_windows() -> None:
    clock = Clock(0.0)
    arrivals = Arrivals(window=1.0, clock=clock)
    for _ in range(30):
        arrivals.add("a")
    for _ in range(10):
        arrivals.add("b")
    arrivals.add("c")
    assert arrivals.flooding("a") and arrivals.flooding("b"), "10 of 41 is half of a third"
    assert not arrivals.flooding("c")
    clock.now += 1.5  # a new window: the last one still counts
    arrivals.add("c")
    assert arrivals.flooding("a") and not arrivals.flooding("c")
    clock.now += 1.0  # two windows on: only the newest calls count
    arrivals.add("c")
    assert arrivals.flooding("c") and not arrivals.flooding("a")
    clock.now += 5.0  # quiet for longer than both windows: nothing before counts
    arrivals.add("b")
    assert arrivals.flooding("b") and not arrivals.flooding("c")
