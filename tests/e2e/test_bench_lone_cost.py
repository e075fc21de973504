"""The lone-photo cost benchmark reports every process's CPU per call (never how much)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_lone_cost_benchmark_reports_each_process_and_thread(tmp_path: Path) -> None:
    run_quick("bench.lone_cost", tmp_path, 180, "--threads")
    rows = (tmp_path / "lone_cost.md").read_text().splitlines()[4:]
    names = {row.split("|")[1].strip() for row in rows}
    for process in ("gateway", "inference-a", "postprocess", "preprocess-0", "preprocess-1"):
        assert f"{process} loop" in names
    assert "wall per call" in names
