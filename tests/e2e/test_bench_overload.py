"""The overload benchmark runs and reports every step (never how fast they were)."""

from pathlib import Path

from tests.support.bench import run_quick


def test_the_overload_sweep_runs_and_reports_each_step(tmp_path: Path) -> None:
    out = run_quick("bench.overload", tmp_path)
    assert "capacity (closed loop, 64 in flight)" in out
    assert "every process stayed up" in out
    table = (tmp_path / "overload.md").read_text()
    assert all(f"| {label} |" in table for label in ("0.8x", "2x", "4x"))
    assert "| admin port |" in table
    assert "(admin port " in out
