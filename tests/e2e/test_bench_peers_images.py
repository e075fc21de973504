"""The peers' real-work benchmark in its smoke mode: for the image and the text workload,
Strata and the in-process loop measured, MLServer with 1 and 2 workers measured or skipped
saying why (its venv is built on the first run, which needs the package index), the text
workload skipped saying why where MiniLM is not built. Nothing here asserts speed."""

from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = [pytest.mark.bench, pytest.mark.timeout(1500)]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("peers")
    run_quick("bench.peers.images", out, 1400, "--photo-size", "320x240")
    return out


@pytest.mark.parametrize("workload", ["images", "text"])
def test_every_server_is_measured_or_skipped_with_the_reason(results: Path, workload: str) -> None:
    table = (results / f"peers_{workload}.md").read_text()
    if workload == "text" and "Skipped: no MiniLM" in table:
        return  # `make models-text` not run: said so
    assert "| Strata pipeline (gateway) |" in table, table
    assert "| in-process loop, 1 process at once (no server) |" in table
    assert "| in-process loop, 2 processes at once (no server) |" in table
    by_process = table.split("by process")[1]
    for process in ("gateway", "preprocess-0", "inference-a", "postprocess", "**all**"):
        assert f"| Strata pipeline (gateway) | {process} |" in by_process, by_process
    assert "| in-process loop, 1 process at once (no server) | the loop |" in by_process
    for workers in ("1 worker", "2 workers"):
        measured = f"| MLServer 1.7.1, {workers} (batching 16 / 5 ms) |" in table
        assert measured or f"Skipped mlserver-{workers[0]}:" in table, table
