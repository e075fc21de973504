"""The cascade benchmark's smoke mode: accuracy, capacity and light load of the cascade and
its baselines measured in one run, the results written.

Nothing here asserts speed: the machine is shared, so only the shape of the results counts.
"""

import json

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench

PIPELINES = {"digits-cascade", "digits-large-only", "digits-then-large"}


def test_the_quick_run_measures_the_cascade_against_its_large_model(tmp_path) -> None:
    run_quick("bench.cascade", tmp_path)
    report = json.loads((tmp_path / "cascade.json").read_text())
    accuracy = report["accuracy"]
    assert accuracy["digits-cascade"]["rows"] == accuracy["digits-large-only"]["rows"] > 100
    assert 0 < accuracy["digits-cascade"]["second_stage_share"] < 0.5
    assert accuracy["digits-large-only"]["second_stage_share"] == 0
    for size in report["capacity"].values():
        assert set(size["best"]) == PIPELINES
        for measured in size["best"].values():
            assert measured["count"] > 0 and measured["errors"] == {}
        assert size["throughput_ratio"] > 0
        assert len(size["round_ratios"]) == report["timing"]["rounds"]
        assert all(ratio > 0 for ratio in size["round_ratios"])
    assert set(report["light"]) == PIPELINES
    cpu = report["gateway_cpu_ms_per_request"]
    assert set(cpu) == PIPELINES
    assert all(ms > 0 for runs in cpu.values() for ms in runs.values())
    table = (tmp_path / "cascade.md").read_text()
    assert all(f"| {name} |" in table for name in PIPELINES)
