"""The degradation ladder (services/gateway/door/ladder.py): each signal's pressure against
its threshold, climbing with hysteresis and coming back down, a level forced by the admin
API, and the readings in the metrics."""

import pytest
from prometheus_client import REGISTRY

from services.gateway.door.ladder import LadderController
from strata.config.gateway import Ladder
from tests.support.clock import Clock


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
