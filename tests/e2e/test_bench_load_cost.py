"""The load tool's cost benchmark runs each sender it has against its trivial server and
reports every run (never how cheap they were)."""

from pathlib import Path

import pytest

from bench.load import native
from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_load_cost_runs_and_reports_each_sender(tmp_path: Path) -> None:
    out = run_quick("bench.load_cost", tmp_path)
    senders = ["python", "compiled"] if native.BINARY.is_file() else ["python"]
    table = (tmp_path / "load_cost.md").read_text()
    for label in ("open loop 1000/s", "closed loop of 16"):
        assert all(f"| {label} | {sender} | " in table for sender in senders), table
    assert "load average at the end" in out
