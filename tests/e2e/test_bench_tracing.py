"""The tracing benchmark runs and reports on against off (never how much it costs)."""

from pathlib import Path

from tests.support.bench import run_quick


def test_the_tracing_benchmark_runs_and_reports_on_against_off(tmp_path: Path) -> None:
    out = run_quick("bench.tracing", tmp_path)
    assert "round 1, tracing on, c=8" in out
    table = (tmp_path / "tracing.md").read_text()
    assert "| 1 | 1 |" in table and "| 1 | 8 |" in table
    spans = int(table.split("Spans exported with tracing on: ")[1].split(".")[0].replace(",", ""))
    assert spans > 0, "tracing on exported nothing"
