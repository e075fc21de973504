"""bench.row_cost in a short run: every model it measures has a row at batch 1 and 4 with a
CPU figure each way, the rows a batch and how busy the workers were, and a batch of one
row at batch 1; MiniLM's fitted bucket costs in process and in the service."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.bench
WAYS = 5  # one call, served, flight, flight loop, N in flight


def test_each_model_reports_its_cpu_per_row_each_way(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "bench.row_cost", "--quick", "--out", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True)
    table = (tmp_path / "row_cost.md").read_text()
    assert table in done.stdout
    rows = [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in table.splitlines()
        if line.startswith("| minilm") or line.startswith("| vision")
    ]
    assert {(model, size) for model, size, *_ in rows} >= {("vision", "1"), ("vision", "4")}
    for model, size, *cells in rows:
        figures = [float(cell) for cell in cells]
        assert len(figures) == WAYS + 2 and all(f >= 0 for f in figures), (model, size)
        if size == "1":
            assert figures[WAYS] == 1.0  # one request in flight: a batch of one row
    if any(model == "minilm" for model, *_ in rows):
        # Both copies' fitted bucket costs, the service's read back from its log.
        assert "minilm buckets: in process a call costs" in table
        assert "; service a call costs" in table
