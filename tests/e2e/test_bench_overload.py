"""The overload benchmark runs and reports every step (never how fast they were)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_overload_sweep_runs_and_reports_each_step(tmp_path: Path) -> None:
    out = run_quick("bench.overload", tmp_path)
    assert "every call's deadline: 1 s, capacity search and open loop alike" in out
    assert "capacity (the best of (64,) in flight)" in out
    assert "every process stayed up" in out
    table = (tmp_path / "overload.md").read_text()
    assert "every call's deadline: 1 s" in table
    assert all(f"| {label} |" in table for label in ("0.8x", "2x", "4x"))
    assert all(f"| {column} |" in table for column in ("admin port", "refusal P99 ms", "degraded"))
    assert all(f"| {n} | 2x | as configured |" in table for n in (2, 8))
    assert "(admin port " in out
