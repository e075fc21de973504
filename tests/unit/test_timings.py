"""strata.telemetry.timings: each stage's time in its summary and its histogram's child."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Histogram

from strata.telemetry.timings import Timings


def test_each_stage_counts_in_its_own_histogram_child_and_summary() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("t_stage_seconds", "test", ["pipeline", "stage"], registry=registry)
    timings = Timings(histogram)
    for seconds in (0.002, 0.004):
        timings.record("images", "decode", seconds)
    timings.record("images", "resize", 0.001)

    def count(stage: str) -> float | None:
        labels = {"pipeline": "images", "stage": stage}
        return registry.get_sample_value("t_stage_seconds_count", labels)

    assert (count("decode"), count("resize")) == (2, 1)
    total = registry.get_sample_value(
        "t_stage_seconds_sum", {"pipeline": "images", "stage": "decode"}
    )
    assert total == pytest.approx(0.006)
    summary = timings.snapshot()[("images", "decode")]
    assert (summary.count, summary.max_seconds) == (2, 0.004)
