"""The overload report: side by side per step, no division by a peak goodput of 0, and the
front's own times where a step went through it; its options, and how it fits a front."""

import argparse
import math
from dataclasses import replace

import pytest

from bench.front import FrontSettings
from bench.overload import Step, connection_counts, front_changes, overrides, refitted, report
from strata.config import load_settings
from tests.support.system import DEFAULT_CONFIG


def step(system: str, label: str, goodput: float, connections: int = 8) -> Step:
    return Step(
        system=system,
        connections=connections,
        label=label,
        offered=100.0,
        goodput=goodput,
        admitted_p99_ms=50.0,
        refused=0.0,
        refusal_p99_ms=math.nan,
        degraded=0.25,
        other_errors={"DeadlineExceeded": 3},
        level=3,
        health_ms=(5.0, 1.0, 2.0),
        late_p99_ms=0.4,
        busiest=0.2,
    )


def test_steps_sit_side_by_side_with_their_share_of_each_systems_peak() -> None:
    before = [step("before", "0.8x", 80), step("before", "2x", 40)]
    table = report([*before, step("after", "0.8x", 50), step("after", "2x", 100)])
    rows = [line for line in table.splitlines() if line.startswith("| 8 |")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        ["0.8x", "before"],
        ["0.8x", "after"],
        ["2x", "before"],
        ["2x", "after"],
    ]
    assert "| 80 | 100% |" in rows[0] and "| 40 | 50% |" in rows[2]
    assert "| 50 | 50% |" in rows[1]
    assert "| DeadlineExceeded 3 | 3 |" in rows[0]
    assert "| 0% | - | 25% |" in rows[0]  # no refusal: no refusal time


def test_a_system_that_answered_nothing_in_time_is_reported_not_divided_by() -> None:
    table = report([step("before", "2x", 0.0, connections=1), step("after", "2x", 10.0, 1)])
    assert "| 2x | before | 100 | 0 | - |" in table
    assert "| 2x | after | 100 | 10 | 100% |" in table
    assert "No step of before from 1 connection(s) had a full answer within the objective" in table


def test_against_changes_one_setting_and_keeps_the_rest_of_its_section() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    changed = overrides(["ladder.door_wait_share=0", "ladder.max_level=2"], settings)
    assert changed["ladder"]["door_wait_share"] == 0
    assert changed["ladder"]["max_level"] == 2
    assert changed["ladder"]["tick_seconds"] == settings.gateway.ladder.tick_seconds
    with pytest.raises(SystemExit, match="expected KEY=VALUE"):
        overrides(["ladder.door_wait_share"], settings)


def test_a_step_through_the_front_reports_its_queue_and_gateway_times() -> None:
    fronted = replace(step("behind the front", "2x", 40), front_ms=(48.6, 51.2))
    table = report([step("direct", "2x", 50), fronted])
    assert "| 2x | direct |" in table and table.count("| - | - |") == 1
    assert "| 20% | 49 | 51 |" in table


def test_connection_counts_are_distinct_positive_numbers_in_order() -> None:
    assert connection_counts("2,8") == (2, 8)
    assert connection_counts("8,1,8") == (8, 1)
    for wrong in ("", "0,8", "two", "2,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive counts"):
            connection_counts(wrong)


def test_another_front_changes_only_its_sizing() -> None:
    assert front_changes("places=64,queue_ms=100") == {"places": 64, "queue_ms": 100}
    for wrong in ("maxconn=64", "places=0", "rate=fast", "places"):
        with pytest.raises(argparse.ArgumentTypeError, match="places, queue_ms or rate"):
            front_changes(wrong)


def test_a_front_is_refitted_from_the_best_rate_at_no_more_places() -> None:
    # The loaded run: 32 places read 306/s, slower than 16 in flight had (380/s).
    seen = {16: 380.0, 64: 579.0, 256: 623.0, 32: 306.0}
    sizing = FrontSettings.sized(623, 0.25)
    kept, refit = refitted(sizing, seen, 623, 0.25)
    assert kept == FrontSettings(places=32, queue_ms=50, rate=380)
    assert refit == FrontSettings(places=19, queue_ms=50, rate=380)


def test_a_refit_never_counts_on_more_than_the_capacity_nor_sizes_from_nothing() -> None:
    sizing = FrontSettings.sized(500, 0.25)
    kept, refit = refitted(sizing, {64: 500.0, sizing.places: 900.0}, 500, 0.25)
    assert kept.rate == 500 and refit == sizing
    nothing = {16: 0.0, sizing.places: 0.0}
    assert refitted(sizing, nothing, 500, 0.25) == (sizing, sizing)
