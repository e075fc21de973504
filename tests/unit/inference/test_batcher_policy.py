"""The batching policies and their measurements: execution-time fit, arrival rate, decisions."""

from __future__ import annotations

import math

import pytest

from services.inference.batching_policy import (
    Adaptive,
    ArrivalRate,
    ExecutionModel,
    FixedWindow,
    NoBatching,
    Utilization,
    make_policy,
)
from strata.config.inference import InferenceSettings


def test_execution_model_recovers_fixed_and_per_row_cost() -> None:
    model = ExecutionModel()
    for rows in (1, 4, 16, 64, 8, 32) * 5:
        model.observe(rows, 0.002 + 0.0001 * rows)
    fixed, per_row = model.coefficients()
    assert fixed == pytest.approx(0.002, rel=1e-6)
    assert per_row == pytest.approx(0.0001, rel=1e-6)
    assert model.estimate(10) == pytest.approx(0.003, rel=1e-6)


def test_execution_model_with_one_size_charges_the_batch() -> None:
    model = ExecutionModel()
    assert model.estimate(8) == 0.0
    model.observe(8, 0.004)
    assert model.estimate(8) == pytest.approx(0.004)
    assert model.estimate(1) == pytest.approx(0.004)


def test_execution_model_follows_a_slower_machine() -> None:
    model = ExecutionModel()
    for _ in range(50):
        model.observe(8, 0.001)
    for _ in range(200):
        model.observe(8, 0.010)
    assert model.estimate(8) == pytest.approx(0.010, rel=0.01)


def test_arrival_rate_tracks_gaps_and_drops_after_a_quiet_spell() -> None:
    rate = ArrivalRate()
    assert rate.rows_per_second(0.0) == 0.0
    for i in range(200):
        rate.observe(i * 0.001, 2)  # 2 rows every millisecond
    assert rate.rows_per_second(0.1995) == pytest.approx(2000, rel=0.01)
    assert rate.rows_per_second(1.199) == pytest.approx(2.0, rel=0.01)  # 1 s since the last


def test_utilization_averages_busy_slots_over_time() -> None:
    busy = Utilization(slots=2, horizon=0.1)
    assert busy.value(0.0) == 0.0
    busy.change(0.0, 2)
    assert busy.value(0.1) == pytest.approx(1 - math.exp(-1))
    assert busy.value(10.0) == pytest.approx(1.0)
    busy.change(10.0, 1)
    assert busy.value(20.0) == pytest.approx(0.5)
    busy.change(20.0, 0)
    assert busy.value(20.05) == pytest.approx(0.5 * math.exp(-0.5))


def adaptive(per_batch: float, rows_per_second: float, busy: float = 0.0) -> Adaptive:
    execution, arrivals, utilization = ExecutionModel(), ArrivalRate(), Utilization(100)
    execution.observe(4, per_batch)
    gap = 1.0 / rows_per_second
    for i in range(100):
        arrivals.observe(i * gap, 1)
    utilization.change(-1e3, round(busy * 100))  # busy for ever before time 0
    return Adaptive(0.010, 0.5, 16, execution, arrivals, utilization)


def test_adaptive_runs_a_lone_request_at_once_at_low_load() -> None:
    policy = adaptive(0.004, 10.0)  # one request every 100 ms; the wait bound is 2 ms
    assert policy.start_at(now=9.9, oldest=9.9, rows=1) == 9.9


def test_adaptive_runs_at_once_when_full() -> None:
    assert adaptive(0.004, 1e5).start_at(now=1.0, oldest=1.0, rows=16) == 1.0


def test_adaptive_waits_a_share_of_the_batch_time_when_requests_flow() -> None:
    policy = adaptive(0.004, 1e5)
    now = 100 * 1e-5
    assert policy.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.002)


def test_adaptive_stops_waiting_when_nobody_is_expected_before_the_bound() -> None:
    policy = adaptive(0.004, 1000.0)  # one request per millisecond
    now = 0.099
    assert policy.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.002)
    assert policy.start_at(now=now, oldest=now - 0.0015, rows=2) == now  # 0.5 ms left


def test_adaptive_waits_longer_for_slower_batches_up_to_its_cap() -> None:
    now = 100 * 1e-5
    fast, slower, slow = adaptive(0.002, 1e5), adaptive(0.008, 1e5), adaptive(0.2, 1e5)
    assert fast.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.001)
    assert slower.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.004)
    assert slow.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.010)  # the cap
    # Requests that gathered while a long batch ran have waited past the bound already.
    assert slow.start_at(now=now, oldest=now - 0.05, rows=2) == now


def test_adaptive_waits_longer_as_the_worker_slots_fill() -> None:
    now = 100 * 1e-5
    idle, half, saturated = (adaptive(0.004, 1e5, busy) for busy in (0.0, 0.5, 0.99))
    assert idle.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.002)
    assert half.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.004)
    assert saturated.start_at(now=now, oldest=now, rows=2) == pytest.approx(now + 0.010)
    # However busy, a lone request with nobody expected in time runs at once.
    assert adaptive(0.004, 10.0, 0.99).start_at(now=9.9, oldest=9.9, rows=1) == 9.9


def test_fixed_window_waits_even_when_idle_and_none_never_waits() -> None:
    fixed = FixedWindow(0.005, 16)
    assert fixed.start_at(now=1.0, oldest=1.0, rows=1) == pytest.approx(1.005)
    assert fixed.start_at(now=1.0, oldest=1.0, rows=16) == 1.0
    assert NoBatching().start_at(now=1.0, oldest=0.5, rows=1) == 1.0


@pytest.mark.parametrize(
    ("name", "kind"), [("adaptive", Adaptive), ("fixed", FixedWindow), ("none", NoBatching)]
)
def test_settings_name_the_policy(name: str, kind: type) -> None:
    settings = InferenceSettings.Batching(policy=name)
    policy = make_policy(settings, 8, ExecutionModel(), ArrivalRate(), Utilization(1))
    assert isinstance(policy, kind)
