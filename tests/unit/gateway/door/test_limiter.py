"""The door's token buckets (services/gateway/door/limiter.py): per client, per peer and in
total, their retry hints, and their limits changed at run time."""

import pytest

from services.gateway.door.limiter import RETRY_FLOOR_SECONDS, RateLimiter
from strata.config.gateway import RateLimits, TokenBucket
from tests.support.clock import Clock


def test_bucket_admits_burst_then_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=TokenBucket(rate=10, burst=5)), clock)
    assert [limiter.admit("a")[0] for _ in range(6)] == [True] * 5 + [False]
    admitted, wait, scope = limiter.admit("a")
    assert not admitted and scope == "client" and wait == pytest.approx(0.1)
    clock.now += 0.1
    assert limiter.admit("a")[0] and not limiter.admit("a")[0]
    assert limiter.admit("b")[0], "another client has its own bucket"


def test_a_bucket_a_hair_short_of_its_next_token_still_hints_a_real_wait() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=TokenBucket(rate=10, burst=1)), clock)
    assert limiter.admit("a")[0]
    clock.now += 0.1 - 1e-7  # the next token is 0.1 us away: "retry in 0.000s" before
    assert limiter.admit("a") == (False, RETRY_FLOOR_SECONDS, "client")
    assert RETRY_FLOOR_SECONDS >= 0.001  # a whole millisecond at least, in retry-after-ms


def test_admitted_rate_matches_configured_rate() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=TokenBucket(rate=50, burst=1)), clock)
    admitted = 0
    for _ in range(10_000):  # offered at 1000/s for 10 s
        clock.now += 0.001
        admitted += limiter.admit("flood")[0]
    assert admitted == pytest.approx(500, rel=0.05)


def test_a_flooding_client_does_not_spend_the_shared_budget() -> None:
    clock = Clock()
    limits = RateLimits(
        per_client=TokenBucket(rate=10, burst=10), total=TokenBucket(rate=100, burst=100)
    )
    limiter = RateLimiter(limits, clock)
    for _ in range(1000):
        limiter.admit("flood")
    assert limiter.admit("polite")[0]
    assert limiter.admit("flood") == (False, pytest.approx(0.1), "client")


def test_limits_change_at_run_time() -> None:
    clock = Clock()
    limiter = RateLimiter(RateLimits(per_client=TokenBucket(rate=1, burst=1)), clock)
    assert limiter.admit("a")[0] and not limiter.admit("a")[0]
    limiter.configure(RateLimits())
    assert all(limiter.admit("a")[0] for _ in range(100))


def test_rotating_client_ids_does_not_escape_the_peer_bucket() -> None:
    clock = Clock(0.0)
    limits = RateLimits(per_client=TokenBucket(rate=1, burst=1), peer_clients=3)
    limiter = RateLimiter(limits, clock)
    admitted = [limiter.admit(f"id:{i}", "peer:ipv4:10.0.0.1") for i in range(4)]
    assert [a[0] for a in admitted] == [True, True, True, False]
    assert admitted[3][2] == "peer" and admitted[3][1] == pytest.approx(1 / 3)
    assert limiter.admit("id:other", "peer:ipv4:10.0.0.2")[0], "another peer has its own"
    assert all(limiter.admit(f"key:{i}")[0] for i in range(10)), "a registered key: no peer limit"
    clock.now += 1 / 3
    assert limiter.admit("id:9", "peer:ipv4:10.0.0.1")[0]


def test_no_per_client_limit_means_no_peer_limit_either() -> None:
    limiter = RateLimiter(RateLimits(peer_clients=1))
    assert all(limiter.admit(f"id:{i}", "peer:ipv4:10.0.0.1")[0] for i in range(100))
