"""The tracing benchmark runs and reports on against off per sample ratio (not what it costs)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_tracing_benchmark_runs_and_reports_on_against_off(tmp_path: Path) -> None:
    out = run_quick("bench.tracing", tmp_path)
    assert "round 1, tracing off, c=8" in out
    assert "round 1, tracing on, sample ratio 0.1, c=8" in out
    table = (tmp_path / "tracing.md").read_text()
    assert "Median over 1 rounds of each round's on / off:" in table
    for c in (1, 8, 64):
        medians = [line for line in table.splitlines() if line.startswith(f"| {c} | 1 | ")]
        assert medians, f"no median line for c={c}"
    for c in (1, 8, 64):
        assert f"| 1 | {c} | 1 |" in table and f"| 1 | {c} | 0.1 |" in table
    spans = int(table.split("Spans exported with tracing on: ")[1].split(".")[0].replace(",", ""))
    assert spans > 0, "tracing on exported nothing"
    per_request = float(table.split("Spans a request with every request sampled: ")[1].strip(".\n"))
    assert 1 <= per_request <= 10, per_request
