"""The peers' image benchmark in its smoke mode: Strata and the in-process loop always
measured, MLServer with 1 and 2 workers measured or skipped saying why (its venv is built on
the first run, which needs the package index). Nothing here asserts speed."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.timeout(1200)


def test_every_server_is_measured_or_skipped_with_the_reason(tmp_path: Path) -> None:
    run_quick("bench.peers.images", tmp_path, 1100, "--photo-size", "320x240")
    table = (tmp_path / "peers_images.md").read_text()
    assert "| Strata pipeline (gateway) |" in table
    assert "| in-process loop, 1 process at once (no server) |" in table
    assert "| in-process loop, 2 processes at once (no server) |" in table
    for workers in ("1 worker", "2 workers"):
        measured = f"| MLServer 1.7.1, {workers} (batching 16 / 5 ms) |" in table
        assert measured or f"Skipped mlserver-{workers[0]}:" in table, table
