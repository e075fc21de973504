"""The benchmark suite's smoke mode end to end: it runs, and writes what it says it writes.

Nothing here asserts speed: the machine is shared, so only the shape of the results counts.
"""

import json
from pathlib import Path

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("suite")
    stdout = run_quick("bench.suite", out)
    assert "## Load sweep" in stdout  # the table is printed, not only written
    return out


def test_every_result_file_is_written(results: Path) -> None:
    for name in ("suite.md", "suite.json"):
        assert (results / name).stat().st_size > 0
    for name in ("suite_latency.png", "suite_degradation.png"):
        assert (results / name).read_bytes().startswith(PNG)


def test_both_tracing_runs_measure_every_layer_of_both_pipelines(results: Path) -> None:
    suite = json.loads((results / "suite.json").read_text())
    assert [run["tracing"] for run in suite["runs"]] == [False, True]
    assert set(suite["ceilings"]) == {"digits", "tabular"}
    for run in suite["runs"]:
        assert {p["pipeline"] for p in run["pipelines"]} == {"digits", "tabular"}
        for p in run["pipelines"]:
            for kind in ("direct_capacity", "pipeline_capacity", "direct_light", "pipeline_light"):
                assert p[kind]["count"] > 0 and p[kind]["throughput"] > 0, kind
    assert suite["runs"][1]["spans"] > 0  # tracing on really exported spans
    assert suite["runs"][0]["spans"] == 0


def test_the_sweep_reaches_twice_capacity_and_reads_the_ladder(results: Path) -> None:
    suite = json.loads((results / "suite.json").read_text())
    for run in suite["runs"]:
        swept = [p for p in run["pipelines"] if p["sweep"]]
        assert swept, "no pipeline was swept"
        capacity = swept[0]["pipeline_capacity"]["throughput"]
        steps = swept[0]["sweep"]
        assert steps[-1]["offered"] == pytest.approx(2 * capacity)
        for step in steps:
            assert step["level"] is None or 0 <= step["level"] <= 4
            assert step["goodput"] <= step["throughput"] + 1e-9
            assert 0.0 <= step["error_rate"] <= 1.0
        assert any(step["level"] is not None for step in steps)  # the ladder was read
        assert run["timeline"] and run["steps"]  # the level over time, for the plot


def test_the_markdown_states_the_machine_and_has_every_table(results: Path) -> None:
    text = (results / "suite.md").read_text()
    assert "cores" in text
    for heading in (
        "## Capacity",
        "## Latency at light load",
        "## Tracing on and off",
        "## Load sweep",
    ):
        assert heading in text
