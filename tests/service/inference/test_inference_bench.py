"""The batching benchmark runs end to end in its smoke mode (it measures; nothing here asserts
speed): ceilings, every policy on a real service process for the configured model and the
synthetic MLP, the tables, JSON and plot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.system import DEFAULT_CONFIG, ROOT

pytestmark = pytest.mark.bench


def test_the_batching_benchmark_runs_in_smoke_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            *(sys.executable, "-m", "bench.batching", "--quick"),
            *("--config", str(DEFAULT_CONFIG), "--windows", "2", "--out", str(tmp_path)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "ceiling" in done.stdout and "| adaptive |" in done.stdout
    data = json.loads((tmp_path / "batching.json").read_text())
    assert set(data["models"]) == {"digits", "mlp"}
    for model in data["models"].values():
        assert {row["policy"] for row in model["rows"]} == {"none", "fixed 2 ms", "adaptive"}
        assert all(row["answered"] + sum(row["refused"].values()) > 0 for row in model["rows"])
        assert model["ceiling_rows_per_second"] and model["capacity"] > 0
    assert (tmp_path / "batching.png").stat().st_size > 0
    assert "| model | policy |" in (tmp_path / "batching.md").read_text()
