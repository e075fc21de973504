"""The gateway-processes benchmark runs and reports each count against one process (not what
more processes buy)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_processes_benchmark_runs_and_reports_each_count(tmp_path: Path) -> None:
    out = run_quick("bench.processes", tmp_path)
    for count in (1, 2):
        assert f"round 1, processes {count}, 8 connections: " in out
        assert f"round 1, processes {count}, 1 connections: " in out
    assert "gateway CPU" in out and "0 errors" in out
    table = (tmp_path / "processes.md").read_text()
    for connections in (8, 1):
        assert f"| {connections} | 1 | " in table and table.count(f"| {connections} | 2 | ") == 1
        assert f"| {connections} | 1 | " in table.split(f"| {connections} | 2 | ")[0]
    assert " 1.00 |" in table  # one process against itself
