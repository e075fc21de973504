"""The image-chain benchmark runs a JPEG through the whole chain and reports each point
(never how fast)."""

from pathlib import Path

from tests.support.bench import run_quick


def test_the_image_chain_benchmark_runs_and_reports_each_point(tmp_path: Path) -> None:
    run_quick("bench.image_chain", tmp_path)
    table = (tmp_path / "image_chain.md").read_text()
    assert "| 1 |" in table and "| 16 |" in table
