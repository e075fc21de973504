"""What a client can make the gateway remember is bounded: each structure keyed by a client id,
a peer address, a request's content or a deadline is driven with many distinct clients, and
the memory it holds after the second half of them must not have grown past a small margin.

Memory is measured with tracemalloc (Python's allocations, traced only inside `grown`), so
the test needs no hook in the gateway and costs nothing outside it. A structure that keeps
one entry per client grows by at least ~100 bytes per client (a dict slot and its key), so
6,000 more clients would add 600 KB or more; the margin is a fifth of that.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable

import numpy as np
import pytest

from services.gateway.door.concurrency import AdaptiveLimits
from services.gateway.door.ladder import LadderController
from services.gateway.door.limiter import RateLimiter
from services.gateway.door.refusals import Refusals
from services.gateway.flow.cache import Cached, ResultCache
from services.gateway.upstream.router import Router
from strata.config.gateway import Cache, Concurrency, Ladder, RateLimits, TokenBucket
from strata.config.pipelines import Route
from strata.security.bearer import Throttle
from strata.security.occupancy import Shares

CLIENTS = 6_000
MARGIN = 120_000  # bytes


class Clock:
    """Moves on by `step` seconds each time it is read, as a steady load's clock does."""

    def __init__(self, step: float = 0.001) -> None:
        self.now, self.step = 1000.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def grown(drive: Callable[[int], None]) -> int:
    """Bytes still held after driving clients CLIENTS..2*CLIENTS-1, beyond what was held
    after driving clients 0..CLIENTS-1 (each bound reached by then). Traced from the start,
    so that entries replaced within a bound count as freed."""
    tracemalloc.start()
    try:
        for i in range(CLIENTS):
            drive(i)
        gc.collect()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(CLIENTS, 2 * CLIENTS):
            drive(i)
        gc.collect()
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def ladder_arrivals() -> Callable[[int], None]:
    """Calls from distinct clients reaching a handler and answered, with the door's probe,
    the ladder ticking now and then: its time slots are what it keeps."""
    clock = Clock()
    controller = LadderController(Ladder(), {"digits": 0.5}, clock=clock)

    def drive(i: int) -> None:
        controller.signals.arrived("digits")
        controller.signals.record("digits", 0.01, "ok")
        controller.signals.probed(0.001)
        if i % 250 == 0:
            controller.tick()

    return drive


def router_choices() -> Callable[[int], None]:
    routes = [Route(arm="a", deployment="a", weight=90), Route(arm="b", deployment="b", weight=10)]
    router = Router("digits", routes, None)
    return lambda i: router.choose(f"client-{i}") and None


def rate_limits() -> Callable[[int], None]:
    limits = RateLimits(per_client=TokenBucket(rate=10, burst=5), max_clients=1000)
    limiter = RateLimiter(limits, Clock())
    return lambda i: limiter.admit(f"client-{i}", f"10.{i // 65536}.{i // 256 % 256}.{i % 256}")


def refusals() -> Callable[[int], None]:
    counted = Refusals(Concurrency(), Clock())
    return lambda i: counted.record("concurrency", f"client-{i}", "pipeline 'digits' is full")


def cache_answers() -> Callable[[int], None]:
    """Distinct answers (every client's, or every input's) against a cache whose entry bound
    is past what the test sends: only the time to live bounds it."""
    clock = Clock(step=0.01)
    cache = ResultCache(Cache(max_entries=10 * CLIENTS, ttl_seconds=5), clock)
    answer = Cached({"y": np.ones(1)}, "a", "1")
    return lambda i: cache.put(f"key-{i}", answer)


def admin_guesses() -> Callable[[int], None]:
    throttle = Throttle(max_sources=1000, clock=Clock())
    return lambda i: throttle.failed(f"10.{i // 65536}.{i // 256 % 256}.{i % 256}") and None


def door_places() -> Callable[[int], None]:
    limits = AdaptiveLimits(Concurrency(), {"digits": 0.5})

    def drive(i: int) -> None:
        limits.leave(limits.enter("digits", f"client-{i}"), counts=True)

    return drive


def addresses_held() -> Callable[[int], None]:
    shares = Shares(8)

    def drive(i: int) -> None:
        address = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        shares.take(address)
        shares.give(address)

    return drive


@pytest.mark.parametrize(
    "structure",
    [
        ladder_arrivals,
        router_choices,
        rate_limits,
        refusals,
        cache_answers,
        admin_guesses,
        door_places,
        addresses_held,
    ],
)
def test_many_distinct_clients_leave_memory_flat(structure: Callable) -> None:
    assert grown(structure()) < MARGIN
