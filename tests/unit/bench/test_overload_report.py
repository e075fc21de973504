"""The overload report: side by side per step, goodput as shares of the rates' capacity, of
its system's own and of its best step's (no division by 0), the load tool's cores, and the
front's own times where a step went through it; its options, and how it fits a front."""

import argparse
import math
from dataclasses import replace

import pytest

from bench.front import FrontSettings
from bench.overload import (
    Capacity,
    Step,
    connection_counts,
    drift,
    front_changes,
    holding,
    next_fit,
    overrides,
    report,
)
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
        client_cores=0.83,
    )


def test_steps_sit_side_by_side_with_their_shares_of_capacity_and_peak() -> None:
    before = [step("before", "0.8x", 80), step("before", "2x", 40)]
    steps = [*before, step("after", "0.8x", 50), step("after", "2x", 100)]
    table = report(steps, 100.0, {"before": 80.0, "after": 125.0})
    rows = [line for line in table.splitlines() if line.startswith("| 8 |")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        ["0.8x", "before"],
        ["0.8x", "after"],
        ["2x", "before"],
        ["2x", "after"],
    ]
    # Goodput, then its share of the rates' capacity, of the system's own, of its best step's.
    assert "| 80 | 0.80 | 1.00 | 1.00 |" in rows[0] and "| 40 | 0.40 | 0.50 | 0.50 |" in rows[2]
    assert "| 50 | 0.50 | 0.40 | 0.50 |" in rows[1]
    assert "| DeadlineExceeded 3 | 3 |" in rows[0]
    assert "| 0% | - | 25% |" in rows[0]  # no refusal: no refusal time
    assert "| 20% | 0.83 | - | - |" in rows[0]  # the load tool's cores; not through a front


def test_a_system_that_answered_nothing_in_time_is_reported_not_divided_by() -> None:
    steps = [step("before", "2x", 0.0, connections=1), step("after", "2x", 10.0, 1)]
    table = report(steps, 0.0, {"after": 20.0})
    assert "| 2x | before | 100 | 0 | - | - | - |" in table
    assert "| 2x | after | 100 | 10 | - | 0.50 | 1.00 |" in table
    assert "No step of before from 1 connection(s) had a full answer within the objective" in table


def test_capacity_is_the_best_goodput_and_says_the_old_measure_beside_it() -> None:
    found = Capacity(goodput={16: 700.0, 64: 947.0}, full={16: 720.0, 64: 1184.0})
    assert found.best == 947.0
    assert found.line("capacity", 0.25) == (
        "capacity (the best of (16, 64) in flight, full answers within the 250 ms objective): "
        "947/s; full answers however late, the measure before: 1184/s"
    )


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
    table = report([step("direct", "2x", 50), fronted], 100.0, {})
    assert "| 2x | direct |" in table and table.count("| 0.83 | - | - |") == 1
    assert "| 0.83 | 49 | 51 |" in table


def test_connection_counts_are_distinct_positive_numbers_in_order() -> None:
    assert connection_counts("2,8") == (2, 8)
    assert connection_counts("8,1,8") == (8, 1)
    for wrong in ("", "0,8", "two", "2,-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive counts"):
            connection_counts(wrong)


def test_another_front_changes_only_its_sizing() -> None:
    assert front_changes("places=64,queue_ms=100") == {"places": 64, "queue_ms": 100}
    assert front_changes("threads=1") == {"threads": 1}
    for wrong in ("maxconn=64", "places=0", "rate=fast", "places", "threads=0"):
        with pytest.raises(argparse.ArgumentTypeError, match="places, queue_ms, rate or threads"):
            front_changes(wrong)


def test_a_front_whose_calls_took_too_long_in_the_gateway_is_refitted_to_what_it_cleared() -> None:
    # The quiet run's sizing: 57 places at 1,136/s; past capacity the gateway cleared 425/s,
    # each call 134 ms in it.
    sizing = FrontSettings.sized(1136, 0.25)
    assert sizing.places == 57
    assert next_fit(sizing, 425.0, 0.25, None) == (FrontSettings(22, 12, 425), False)
    # Too few places: each call's time is short, and so is the rate they clear. They grow.
    few = FrontSettings(places=10, queue_ms=12, rate=425)
    assert next_fit(few, 500.0, 0.25, None) == (FrontSettings(25, 12, 500), False)


def test_a_fit_ends_where_the_places_settle_and_keeps_a_sizing_without_answers() -> None:
    sizing = FrontSettings.sized(600, 0.25)  # 30 places
    assert next_fit(sizing, 560.0, 0.25, None) == (FrontSettings(28, 12, 560), True)
    assert next_fit(sizing, 0.0, 0.25, None) == (sizing, True)
    before = FrontSettings(40, 12, 500)
    assert next_fit(sizing, 0.0, 0.25, before) == (before, True)


def test_a_fit_keeps_the_places_whose_cut_cost_the_gateway_its_rate() -> None:
    # A loaded machine: 10 places cleared 123/s (81 ms a call), 7 only 73/s (96 ms). The
    # gateway's own time is past the 50 ms share, and fewer places only clear less.
    before = FrontSettings(10, 12, 123)
    assert next_fit(FrontSettings(7, 12, 200), 73.0, 0.25, before) == (before, True)
    # Fewer places that clear nearly as much are the next step.
    assert next_fit(FrontSettings(7, 12, 200), 110.0, 0.25, before) == (
        FrontSettings(6, 12, 110),
        True,
    )


def test_fewer_places_are_kept_while_they_clear_the_gateways_best_rate() -> None:
    # Past capacity each call spends places / rate in the gateway: fewer places that clear
    # nearly the best rate shorten that time. A cut that costs more of it stops the cuts.
    fewer = FrontSettings(76, 12, 1986)
    assert holding(1986.0, fewer, 1950.0) == FrontSettings(76, 12, 1950)
    assert holding(1986.0, fewer, 1880.0) is None


def test_a_sweep_whose_capacity_moved_by_more_than_a_tenth_is_said_to_be_no_result() -> None:
    assert drift(1000, 1080) == "The same search after the sweep found 1080/s (+8%)."
    for after in (1110, 880):
        assert "speed moved during the sweep" in drift(1000, after)
