"""The gateway's policy pieces alone: token buckets, A/B router, ladder, cache, breaker."""

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.gateway.door.forced_arm import ForcedArm
from services.gateway.door.ladder import LadderController
from services.gateway.door.limiter import RETRY_FLOOR_SECONDS, RateLimiter
from services.gateway.flow.cache import Cached, ResultCache, cache_key
from services.gateway.request import Caller
from services.gateway.upstream.breaker import CircuitBreaker
from services.gateway.upstream.router import Router
from strata import codec
from strata.config.gateway import ApiKey, Breaker, Cache, Ladder, RateLimits, TokenBucket
from strata.config.pipelines import Route, Shadow
from strata.errors import InvalidArgument, PermissionDenied, Unavailable
from strata.security import KeyRing, key_hash
from strata.stack import Raw


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


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


def routes(a: float = 90, b: float = 10) -> list[Route]:
    return [Route(arm="a", deployment="a", weight=a), Route(arm="b", deployment="b", weight=b)]


def test_split_follows_weights_and_clients_stick() -> None:
    router = Router("digits", routes(), None)
    chosen = [router.choose(f"client-{i}").arm for i in range(10_000)]
    assert chosen.count("b") / len(chosen) == pytest.approx(0.10, abs=0.02)
    assert all(router.choose(f"client-{i}").arm == chosen[i] for i in range(500))


def test_forced_arm_and_unknown_arm() -> None:
    router = Router("digits", routes(100, 0), None)
    assert router.choose("x", forced="b").arm == "b"
    with pytest.raises(InvalidArgument, match="no arm 'zz'"):
        router.choose("x", forced="zz")


def forcing(*keys: tuple[str, list[str]]) -> ForcedArm:
    """The forced-arm policy with API keys each (key, capabilities); none: the door is open."""
    ring = KeyRing([ApiKey(client_id=k, sha256=key_hash(k), capabilities=c) for k, c in keys])
    return ForcedArm({}, ring)


def sent(key: str | None = None) -> Caller:
    return Caller({"x-api-key": key} if key else {}, "ipv4:127.0.0.1:5000", None)


def test_forcing_an_arm_is_a_capability_of_keys() -> None:
    router = Router("digits", routes(100, 0), None)
    keyed = forcing(("ops", ["force_arm"]), ("app", []))
    keyed.check(sent("ops"), router, "a")
    keyed.check(sent("ops"), router, "b")  # rolled back: the capability may
    for who in ("app", None):
        with pytest.raises(PermissionDenied, match="granted the 'force_arm' capability"):
            keyed.check(sent(who), router, "a")


def test_with_the_door_open_only_a_weighted_arm_may_be_forced() -> None:
    router = Router("digits", routes(100, 0), None)
    forcing().check(sent(), router, "a")
    with pytest.raises(PermissionDenied, match="arm 'b' has weight 0 \\(rolled back\\)"):
        forcing().check(sent(), router, "b")


def test_weights_change_and_bad_weights_are_refused() -> None:
    router = Router("digits", routes(), None)
    router.set_weights({"a": 0, "b": 1})
    assert {router.choose(f"c{i}").arm for i in range(200)} == {"b"}
    with pytest.raises(InvalidArgument):
        router.set_weights({"b": 0})
    with pytest.raises(InvalidArgument):
        router.set_weights({"c": 1})


def test_unusable_arm_falls_back_to_a_healthy_one() -> None:
    router = Router("digits", routes(50, 50), None)
    assert {router.choose(f"c{i}", usable=lambda r: r.arm == "b").arm for i in range(100)} == {"b"}
    with pytest.raises(Unavailable):
        router.choose("c", usable=lambda r: False)


def test_shadow_fraction() -> None:
    router = Router("digits", routes(), Shadow(deployment="b", fraction=0.25))
    share = np.mean([router.mirrors(f"r{i}") for i in range(4000)])
    assert share == pytest.approx(0.25, abs=0.03)
    assert not Router("digits", routes(), None).mirrors("r")


def ladder(**overrides) -> LadderController:
    settings = Ladder(up_after=2, down_after=3, down_below=0.5, window_seconds=1.0, **overrides)
    return LadderController(settings, {"digits": 0.1}, clock=CLOCK)


CLOCK = Clock()


def queueing(controller: LadderController, seconds: float, ticks: int) -> list[int]:
    """The level after each of `ticks` ticks, requests queueing `seconds` meanwhile."""
    levels = []
    for _ in range(ticks):
        CLOCK.now += 0.25
        for _ in range(10):
            controller.signals.queued("digits", seconds)
        levels.append(controller.tick())
    return levels


def test_queueing_delay_climbs_with_hysteresis_and_comes_back_down() -> None:
    controller = ladder()  # the threshold: a quarter of the 100 ms objective
    assert queueing(controller, 0.05, 4) == [0, 1, 1, 2]
    assert "queue_delay:digits 0.05 s against 0.025 s" in controller.reason
    assert queueing(controller, 0.02, 5) == [2] * 5  # between the thresholds: hold
    assert queueing(controller, 0.001, 10)[-1] == 0
    assert controller.reason.startswith("calm")


def test_queueing_alone_never_gives_up_full_answers() -> None:
    controller = ladder()
    assert max(queueing(controller, 0.05, 12)) == 2


def test_latency_over_objective_raises_pressure_up_to_the_cache_level() -> None:
    controller = ladder()
    for _ in range(8):
        CLOCK.now += 0.25
        for _ in range(10):
            controller.signals.record("digits", 0.5, "ok")
        controller.tick()
    assert controller.readings["latency:digits"].pressure == pytest.approx(5.0)
    assert controller.level == 4


def failing(controller: LadderController, ok: int, errors: int, ticks: int) -> list[int]:
    """The level after each of `ticks` ticks, each tick adding `ok` answers and `errors`."""
    levels = []
    for _ in range(ticks):
        CLOCK.now += 0.25
        for kind, count in (("ok", ok), ("error", errors)):
            for _ in range(count):
                controller.signals.record("digits", 0.001, kind)
        levels.append(controller.tick())
    return levels


def test_a_handful_of_failures_at_low_volume_does_not_climb() -> None:
    controller = ladder(min_error_samples=20)  # the window holds 4 ticks
    assert failing(controller, ok=1, errors=1, ticks=12) == [0] * 12  # 8 outcomes, half failed
    assert "errors" not in controller.readings


def test_errors_at_volume_climb() -> None:
    controller = ladder(min_error_samples=20)
    assert failing(controller, ok=4, errors=4, ticks=10)[-1] >= 3
    assert controller.readings["errors"].pressure == pytest.approx(0.5 / 0.2)


def test_forced_level_wins_until_released() -> None:
    changes = []
    controller = LadderController(Ladder(), {}, lambda old, new, why: changes.append(new))
    controller.force(3)
    assert controller.tick() == 3
    controller.force(None)
    for _ in range(Ladder().down_after):
        controller.tick()
    assert controller.level == 2 and changes == [3, 2]


def test_cache_is_bounded_and_expires() -> None:
    clock = Clock()
    cache = ResultCache(Cache(max_entries=2, ttl_seconds=10), clock)
    answer = Cached({"y": np.ones(1)}, "a", "1")
    for key in ("k1", "k2", "k3"):
        cache.put(key, answer)
    assert cache.get("k1") is None and cache.get("k3") is answer and len(cache) == 2
    clock.now += 11
    assert cache.get("k3") is None


def raw(name: str, array: np.ndarray) -> list[Raw]:
    return [Raw(name, codec.datatype_of(array), array.shape, codec.to_raw(array))]


def test_cache_key_depends_on_inputs_version_and_pipeline() -> None:
    x = raw("x", np.arange(4, dtype=np.float32))
    key = cache_key("p", "a:1", x)
    assert key == cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float32)))
    assert key != cache_key("p", "a:2", x)
    assert key != cache_key("q", "a:1", x)
    assert key != cache_key("p", "a:1", raw("y", np.arange(4, dtype=np.float32)))
    assert key != cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float64)))
    assert key != cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float32).reshape(2, 2)))
    assert key != cache_key("p", "a:1", x, "id:alice") != cache_key("p", "a:1", x, "id:bob")


def test_breaker_opens_fails_fast_and_probes() -> None:
    clock = Clock()
    breaker = CircuitBreaker("up", Breaker(failures=3, open_seconds=2), clock)
    for _ in range(3):
        assert breaker.allow()
        breaker.record(grpc.StatusCode.UNAVAILABLE)
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 2
    assert breaker.allow() and not breaker.allow(), "one probe at a time"
    breaker.record(grpc.StatusCode.UNAVAILABLE)
    assert breaker.state == "open"
    clock.now += 2
    assert breaker.allow()
    breaker.record(grpc.StatusCode.INVALID_ARGUMENT)  # it answered: it is up
    assert breaker.state == "closed"
    breaker.record(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert breaker.state == "closed"


def test_a_lagging_event_loop_raises_pressure() -> None:
    controller = ladder()
    controller.signals.loop_lag = 0.3  # the loop fell 300 ms behind its tick
    controller.tick()
    assert controller.readings["event_loop"].pressure == pytest.approx(3.0)
    assert controller.tick() == 1
    sample = REGISTRY.get_sample_value
    labels = {"signal": "event_loop", "reading": "value"}
    assert sample("strata_gateway_ladder_signal", labels) == pytest.approx(300.0)
    assert sample("strata_gateway_ladder_signal", {**labels, "reading": "threshold"}) == 100
