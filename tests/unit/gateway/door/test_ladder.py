"""The degradation ladder (services/gateway/door/ladder.py): each signal's pressure against
its threshold, climbing with hysteresis and coming back down, congestion counted only past
capacity (the door refusing calls for want of it), a level forced by the admin API, and the
readings in the metrics."""

import pytest
from prometheus_client import REGISTRY

from services.gateway.door.ladder import LadderController, counted
from strata.config.gateway import Ladder
from tests.support.clock import Clock


def ladder(**overrides) -> LadderController:
    settings = Ladder(
        up_after=2,
        down_after=3,
        down_below=0.5,
        window_seconds=1.0,
        **{"min_error_samples": 10, **overrides},
    )
    return LadderController(settings, {"digits": 0.1, "text": 0.1}, clock=CLOCK)


CLOCK = Clock()


def calls(controller: LadderController, refused: float, reason: str = "waited") -> None:
    """A hundred calls of digits, `refused` in ten of them refused by the door for `reason`:
    past capacity, an open loop's excess is refused; a closed loop's waits and none is."""
    signals = controller.signals
    for i in range(100):
        signals.arrived("digits")
        if i < refused * 10:
            signals.refused("digits", reason)


def queueing(
    controller: LadderController, seconds: float, ticks: int, refused: int = 5
) -> list[int]:
    """The level after each of `ticks` ticks, requests queueing `seconds` meanwhile and
    `refused` in ten of each tick's calls refused for want of capacity."""
    levels = []
    for _ in range(ticks):
        CLOCK.now += 0.25
        calls(controller, refused)
        for _ in range(10):
            controller.signals.queued("digits", seconds)
        levels.append(controller.tick())
    return levels


def test_queueing_delay_climbs_with_hysteresis_and_comes_back_down() -> None:
    controller = ladder()  # the threshold: a quarter of the 100 ms objective
    assert queueing(controller, 0.05, 4) == [0, 1, 1, 2]
    assert "queue_delay:digits 0.05 s against 0.025 s" in controller.reason
    assert queueing(controller, 0.02, 5, refused=0) == [2] * 5  # between the thresholds: hold
    assert queueing(controller, 0.001, 10, refused=0)[-1] == 0
    assert controller.reason.startswith("calm")


def test_queueing_alone_never_gives_up_full_answers() -> None:
    controller = ladder()
    assert max(queueing(controller, 0.05, 12)) == 2


def slow(controller: LadderController, ticks: int, refused: int) -> list[int]:
    """The level after each tick of ten calls answered in 500 ms (five times the objective),
    `refused` in ten of a hundred more calls refused for want of capacity."""
    levels = []
    for _ in range(ticks):
        CLOCK.now += 0.25
        calls(controller, refused)
        for _ in range(10):
            controller.signals.record("digits", 0.5, "ok")
        levels.append(controller.tick())
    return levels


def test_latency_over_objective_past_capacity_raises_pressure_up_to_the_cache_level() -> None:
    controller = ladder()
    slow(controller, 8, refused=5)
    assert controller.readings["latency:digits"].pressure == pytest.approx(5.0)
    assert controller.level == 4


def test_a_closed_loop_at_capacity_moves_no_level_however_long_it_waits() -> None:
    # A closed loop keeps its calls in flight however long they take; none is refused (it
    # waits at the door), so its latency, queueing and the loop's lag are its own choice.
    controller = ladder()
    controller.signals.loop_lag = 0.3
    levels = slow(controller, 12, refused=0) + queueing(controller, 0.05, 12, refused=0)
    assert levels == [0] * 24
    shown = controller.readings  # every signal is still read and shown
    assert shown["queue_delay:digits"].pressure > 1 and shown["event_loop"].pressure > 1
    assert shown["overload:digits"].value == 0.0
    assert controller.reason == "no signal has reached its threshold"


def test_a_clients_refusals_for_its_own_share_are_not_overload() -> None:
    controller = ladder()
    for reason in ("client_share", "queue_share"):
        for _ in range(8):
            CLOCK.now += 0.25
            calls(controller, 10, reason)
            controller.signals.queued("digits", 0.05)
            assert controller.tick() == 0
    assert controller.readings["overload:digits"].value == 0.0


def test_overload_is_the_share_of_calls_refused_for_capacity_once_there_are_some() -> None:
    controller = ladder()
    CLOCK.now += 0.25
    for _ in range(4):
        controller.signals.arrived("digits")
    controller.signals.refused("digits", "concurrency")
    controller.tick()
    assert "overload:digits" not in controller.readings  # 4 calls, fewer than 5
    CLOCK.now += 0.25
    calls(controller, 2, "level")
    controller.tick()
    assert controller.readings["overload:digits"].value == pytest.approx(21 / 104)
    assert controller.readings["overload:digits"].threshold == pytest.approx(0.1)


def test_once_climbed_congestion_counts_until_overload_is_calm() -> None:
    # Refused share 0.07: under the threshold (0.1), above calm (down_below: 0.05).
    controller = ladder()
    assert queueing(controller, 0.05, 4)[-1] == 2
    assert queueing(controller, 0.05, 12, refused=0.7) == [2] * 12
    assert queueing(controller, 0.05, 12, refused=0)[-1] == 0


def test_overload_alone_moves_no_level() -> None:
    # It lets congestion count; with no queue, the door alone holds the excess back.
    controller = ladder()
    assert queueing(controller, 0.0, 12) == [0] * 12
    assert controller.readings["overload:digits"].pressure == pytest.approx(5.0)


def test_one_pipelines_overload_does_not_count_anothers_congestion() -> None:
    controller = ladder(max_level=0)  # readings only
    calls(controller, 5)
    for _ in range(10):
        controller.signals.record("text", 0.5, "ok")
    CLOCK.now += 0.25
    calls(controller, 5)
    controller.tick()
    assert controller.readings["latency:text"].pressure == pytest.approx(5.0)
    moving = counted(controller.readings)
    assert "latency:text" not in moving and "overload:digits" not in moving


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


def test_a_lagging_event_loop_past_capacity_raises_pressure() -> None:
    controller = ladder()
    controller.signals.loop_lag = 0.3  # the loop fell 300 ms behind its tick
    calls(controller, 5)
    calls(controller, 5)
    controller.tick()
    assert controller.readings["event_loop"].pressure == pytest.approx(3.0)
    assert controller.tick() == 1
    sample = REGISTRY.get_sample_value
    labels = {"signal": "event_loop", "reading": "value"}
    assert sample("strata_gateway_ladder_signal", labels) == pytest.approx(300.0)
    assert sample("strata_gateway_ladder_signal", {**labels, "reading": "threshold"}) == 100
