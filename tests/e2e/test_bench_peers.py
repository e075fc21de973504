"""The peer benchmark's smoke mode: every server measured (or skipped, saying why), reported.

Nothing here asserts speed: the machine is shared, so only the shape of the results counts.
MLServer and KServe are installed into venvs of their own on the first run (which needs the
package index); a peer whose venv cannot be built is skipped, never Strata (gRPC and REST) or
the bare server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.bench import run_quick

ALWAYS = ("pipeline", "pipeline-rest", "inference", "bare")
PEERS = {  # each peer, and the ratio of Strata's throughput to its
    "mlserver": "throughput_pipeline_over_mlserver",
    "mlserver-rest": "throughput_pipeline_rest_over_mlserver_rest",
    "kserve": "throughput_pipeline_over_kserve",
}

# The first run installs both peers' venvs; a quick run still takes minutes (slow: it goes
# out first to a worker of its own, tests/support/spread.py).
pytestmark = [pytest.mark.bench, pytest.mark.timeout(1800), pytest.mark.slow]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("peers")
    run_quick("bench.peers", out, timeout=1700)
    return out


@pytest.fixture(scope="module")
def report(results: Path) -> dict:
    return json.loads((results / "peers.json").read_text())


def test_every_report_file_is_written(results: Path) -> None:
    for suffix in ("md", "json", "png"):
        assert (results / f"peers.{suffix}").stat().st_size > 0, suffix


def test_strata_and_the_bare_server_always_run(report: dict, results: Path) -> None:
    assert "cores" in report["machine"]
    table = (results / "peers.md").read_text()
    for server in ALWAYS:
        assert server not in report["skipped"], report["skipped"]
        _check_rows(report, server)
        assert f"| {report['servers'][server]['title']} |" in table, server
    pipeline = {r["concurrency"]: r for r in report["servers"]["pipeline"]["rows"]}
    assert {"gateway", "postprocess", "inference-a"} <= set(pipeline[1]["cpu_ms_per_request"])
    ratios = report["ratios"]
    assert ratios["throughput_pipeline_over_bare"] > 0
    assert ratios["p50_pipeline_minus_inference_ms"] is not None
    assert ratios["rest_over_grpc_c1"] > 0 and ratios["rest_over_grpc_c8"] > 0
    assert "REST / gRPC throughput, Strata pipeline: c=1: " in table


@pytest.mark.parametrize("peer", list(PEERS))
def test_each_peer_runs_or_says_why_not(report: dict, results: Path, peer: str) -> None:
    if peer in report["skipped"]:
        assert report["skipped"][peer], "a skipped peer needs a reason"
        assert peer in (results / "peers.md").read_text()
        pytest.skip(f"{peer}: {report['skipped'][peer]}")
    _check_rows(report, peer)
    assert f"| {report['servers'][peer]['title']} |" in (results / "peers.md").read_text()
    assert report["ratios"][PEERS[peer]] > 0


def _check_rows(report: dict, server: str) -> None:
    rows = report["servers"][server]["rows"]
    assert [r["concurrency"] for r in rows] == [1, 8], server
    for row in rows:
        assert row["count"] > 0 and row["errors"] == {}, (server, row["errors"])
        assert row["cpu_ms_per_request_total"] > 0, server
