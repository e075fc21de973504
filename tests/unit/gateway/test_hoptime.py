"""Hop timeouts follow the hop's recent P99, within their floor and ceiling."""

import pytest

from services.gateway.hoptime import HopTimer
from strata.config.gateway import HopTimeouts

SETTINGS = HopTimeouts(multiplier=5, floor_seconds=0.05, window=64, min_samples=32)


def test_the_ceiling_holds_until_enough_calls_are_seen() -> None:
    timer = HopTimer(SETTINGS, ceiling=10.0)
    for _ in range(31):
        timer.observe(0.02)
    assert timer.timeout == 10.0


def test_the_timeout_is_a_multiple_of_the_recent_p99_within_its_bounds() -> None:
    timer = HopTimer(SETTINGS, ceiling=10.0)
    for _ in range(64):
        timer.observe(0.02)
    assert timer.timeout == pytest.approx(0.1)
    for _ in range(64):
        timer.observe(0.001)
    assert timer.timeout == pytest.approx(0.05), "never under the floor"
    for _ in range(64):
        timer.observe(5.0)
    assert timer.timeout == 10.0, "never over the ceiling"
