"""The image-chain benchmark runs a JPEG through the whole chain and reports each point
(never how fast)."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_image_chain_benchmark_runs_and_reports_each_point(tmp_path: Path) -> None:
    run_quick("bench.image_chain", tmp_path)
    table = (tmp_path / "image_chain.md").read_text()
    assert "| 1 |" in table and "| 16 |" in table


def test_the_replica_comparison_runs_each_count_and_reports_each_replica(tmp_path: Path) -> None:
    run_quick("bench.image_chain", tmp_path, 300, "--replicas", "1,2", "--photo-size", "320x240")
    table = (tmp_path / "image_replicas.md").read_text()
    one = next(line for line in table.splitlines() if line.startswith("| 1 | 1 x 1 |"))
    two = next(line for line in table.splitlines() if line.startswith("| 1 | 2 x 1 |"))
    assert "/" not in one.split("|")[7] and len(two.split("|")[7].split("/")) == 2
    in_steps = [float(share) for share in two.split("|")[8].split("/")]  # each replica's
    assert len(in_steps) == 2 and all(0 < share <= 100 for share in in_steps)
    assert "| 2 x 1 |" in table.split("median images/s")[1]
