"""The wait before the door: a client's deadline already spent on arrival, as a ladder signal."""

import pytest

from services.gateway.door.ladder import MOST_CLIENTS, Deadlines, LadderController
from strata.config.gateway import Ladder


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_call_with_less_of_its_clients_deadline_left_waited_the_difference() -> None:
    deadlines = Deadlines(memory=60.0, clock=Clock())
    assert deadlines.waited("a", 1.0) == 0.0  # the first call is the reference
    assert deadlines.waited("a", 0.7) == pytest.approx(0.3)
    assert deadlines.waited("a", 0.999) == pytest.approx(0.001)  # a hair: keeps it fresh
    assert deadlines.waited("b", 5.0) == 0.0  # each client has its own
    assert deadlines.waited("b", 4.0) == pytest.approx(1.0)
    assert deadlines.waited("a", 0.5) == pytest.approx(0.5)


def test_a_longer_deadline_becomes_the_reference_at_once() -> None:
    deadlines = Deadlines(memory=60.0, clock=Clock())
    deadlines.waited("a", 1.0)
    assert deadlines.waited("a", 2.0) == 0.0
    assert deadlines.waited("a", 1.0) == pytest.approx(1.0)


def test_a_reference_not_matched_within_its_memory_gives_way() -> None:
    clock = Clock()
    deadlines = Deadlines(memory=10.0, clock=clock)
    deadlines.waited("a", 5.0)
    clock.now += 5
    assert deadlines.waited("a", 1.0) == pytest.approx(4.0)  # still remembered
    clock.now += 6  # 11 s since 5 s left was last seen: the client shortened its deadline
    assert deadlines.waited("a", 1.0) == 0.0
    assert deadlines.waited("a", 0.8) == pytest.approx(0.2)


def test_references_are_kept_for_a_bounded_number_of_clients() -> None:
    deadlines = Deadlines(memory=60.0, clock=Clock())
    deadlines.waited("first", 1.0)
    for n in range(MOST_CLIENTS):
        deadlines.waited(f"client-{n}", 1.0)
    assert deadlines.waited("first", 0.5) == 0.0  # forgotten, so it is the reference again
    assert deadlines.waited(f"client-{MOST_CLIENTS - 1}", 0.5) == pytest.approx(0.5)


def controller(clock: Clock, **overrides) -> LadderController:
    # Half the objective, as the scenarios below were written against (the default is all of it).
    settings = Ladder(
        up_after=2, down_after=3, down_below=0.5, **{"door_wait_share": 0.5, **overrides}
    )
    return LadderController(settings, {"digits": 0.1}, clock=clock)


def arriving(ladder: LadderController, clock: Clock, waited: float, ticks: int) -> list[int]:
    """The level after each tick, ten calls a tick reaching the handler `waited` seconds late
    (a 1 s deadline, one call in each tick with all of it left)."""
    levels = []
    for _ in range(ticks):
        clock.now += 0.25
        ladder.signals.arrived("digits", "bench", 1.0)
        for _ in range(9):
            ladder.signals.arrived("digits", "bench", 1.0 - waited)
        levels.append(ladder.tick())
    return levels


def test_waiting_before_the_door_climbs_past_batching_to_cheaper_answers() -> None:
    clock = Clock()
    ladder = controller(clock)  # the threshold: half the 100 ms objective
    assert arriving(ladder, clock, 0.2, 6) == [0, 1, 1, 2, 2, 3]
    reading = ladder.readings["door_wait:digits"]
    assert reading.value == pytest.approx(0.2)
    assert reading.threshold == pytest.approx(0.05)
    assert "door_wait:digits 0.2 s against 0.05 s" in ladder.reason
    assert arriving(ladder, clock, 0.2, 2)[-1] == 4  # still late at level 3: shed


def test_a_new_level_is_judged_on_the_calls_that_came_after_it() -> None:
    clock = Clock()
    ladder = controller(clock)
    assert arriving(ladder, clock, 0.2, 6)[-1] == 3
    # Calls no longer wait: though the one-second window still holds late calls from before
    # the move, only those after it count, so it does not climb on to shedding; three calm
    # ticks make a step down.
    assert arriving(ladder, clock, 0.0, 3) == [3, 3, 2]
    assert ladder.readings["door_wait:digits"].value == 0.0
    assert ladder.reason.startswith("calm")


def test_the_wait_is_read_over_its_own_short_window() -> None:
    clock = Clock()
    ladder = controller(clock, max_level=0)  # never moves: only the window forgets
    arriving(ladder, clock, 0.2, 4)
    assert ladder.readings["door_wait:digits"].value == pytest.approx(0.2)
    arriving(ladder, clock, 0.0, 5)  # over a second of calls that did not wait
    assert ladder.readings["door_wait:digits"].value == 0.0


def test_calls_without_a_deadline_say_nothing_and_a_share_of_0_turns_it_off() -> None:
    clock = Clock()
    ladder = controller(clock)
    for _ in range(20):
        ladder.signals.arrived("digits", "bench", None)
        ladder.signals.arrived("digits", "bench", float("inf"))
    ladder.tick()
    assert "door_wait:digits" not in ladder.readings
    off = controller(clock, door_wait_share=0)
    assert arriving(off, clock, 0.5, 8) == [0] * 8
    assert "door_wait:digits" not in off.readings


def test_a_reload_changes_the_reference_memory() -> None:
    clock = Clock()
    ladder = controller(clock)
    ladder.configure(Ladder(deadline_memory_seconds=5.0), {"digits": 0.1})
    assert ladder.signals.deadlines.memory == 5.0
