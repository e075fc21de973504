"""The wait before the door: the gateway's own probe through it, as a ladder signal."""

import pytest

from services.gateway.door.ladder import LadderController, counted
from strata.config.gateway import Ladder
from tests.support.clock import Clock


def controller(clock: Clock, **overrides) -> LadderController:
    # Half the objective, as the scenarios below were written against (the default is all of it).
    settings = Ladder(
        up_after=2, down_after=3, down_below=0.5, **{"door_wait_share": 0.5, **overrides}
    )
    return LadderController(settings, {"digits": 0.1, "text": 0.4}, clock=clock)


def probing(ladder: LadderController, clock: Clock, waited: float, ticks: int) -> list[int]:
    """The level after each tick, a digits call and a probe answered after `waited` each."""
    levels = []
    for _ in range(ticks):
        clock.now += 0.25
        ladder.signals.arrived("digits")
        ladder.signals.probed(waited)
        levels.append(ladder.tick())
    return levels


def test_the_probe_is_read_for_each_pipeline_with_calls_against_its_own_objective() -> None:
    clock = Clock()
    ladder = controller(clock, max_level=0)
    probing(ladder, clock, 0.03, 4)
    reading = ladder.readings["door_wait:digits"]
    assert reading.value == pytest.approx(0.03)
    assert reading.threshold == pytest.approx(0.05)
    assert "door_wait:text" not in ladder.readings  # no call of it waited
    ladder.signals.arrived("text")
    ladder.tick()
    assert ladder.readings["door_wait:text"].threshold == pytest.approx(0.2)


def test_waiting_before_the_door_climbs_past_batching_to_cheaper_answers() -> None:
    clock = Clock()
    ladder = controller(clock)  # the threshold: half the 100 ms objective
    assert probing(ladder, clock, 0.2, 6) == [0, 1, 1, 2, 2, 3]
    assert "door_wait:digits 0.2 s against 0.05 s" in ladder.reason
    assert probing(ladder, clock, 0.2, 2)[-1] == 4  # still late at level 3: shed


def test_one_late_probe_among_several_moves_nothing() -> None:
    clock = Clock()
    ladder = controller(clock)
    probing(ladder, clock, 0.001, 4)
    levels = probing(ladder, clock, 0.5, 1) + probing(ladder, clock, 0.001, 4)
    assert levels == [0] * 5
    assert ladder.readings["door_wait:digits"].value == pytest.approx(0.001)


def test_a_new_level_is_judged_on_the_probes_answered_after_it() -> None:
    clock = Clock()
    ladder = controller(clock)
    assert probing(ladder, clock, 0.2, 6)[-1] == 3
    # The door no longer keeps anyone: though the one-second window still holds late probes
    # from before the move, only those after it count, so it does not climb on to shedding;
    # three calm ticks make a step down.
    assert probing(ladder, clock, 0.0, 3) == [3, 3, 2]
    assert ladder.readings["door_wait:digits"].value == 0.0
    assert ladder.reason.startswith("calm")


def test_the_wait_is_read_over_its_own_short_window() -> None:
    clock = Clock()
    ladder = controller(clock, max_level=0)  # never moves: only the window forgets
    probing(ladder, clock, 0.2, 4)
    assert ladder.readings["door_wait:digits"].value == pytest.approx(0.2)
    probing(ladder, clock, 0.0, 5)  # over a second of probes that did not wait
    assert ladder.readings["door_wait:digits"].value == 0.0
    clock.now += 2  # neither calls nor probes: no reading
    ladder.tick()
    assert "door_wait:digits" not in ladder.readings


def test_a_share_of_0_turns_it_off() -> None:
    clock = Clock()
    off = controller(clock, door_wait_share=0)
    assert probing(off, clock, 0.5, 8) == [0] * 8
    assert "door_wait:digits" not in off.readings


def test_waiting_before_the_door_lets_the_queueing_inside_count() -> None:
    # Past capacity the excess piles up before the door, which refuses none of it.
    clock = Clock()
    ladder = controller(clock, door_wait_share=1.0, queue_delay_share=0.1, max_level=0)
    for waited in (0.05, 0.2):  # half the 100 ms objective, then twice it
        clock.now += 0.25
        for _ in range(5):
            ladder.signals.arrived("digits")
            ladder.signals.queued("digits", 0.05)
        ladder.signals.probed(waited)
        ladder.tick()
        moving = counted(ladder.readings)
        assert ("queue_delay:digits" in moving) is (waited > 0.1)
        assert "door_wait:digits" in moving
