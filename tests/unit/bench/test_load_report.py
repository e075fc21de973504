"""The load tool's report: ghz's field names, types, units and nearest-rank percentiles."""

import json

import grpc
import numpy as np
import pytest

from bench.load.codes import GO_NAMES, go_error
from bench.load.report import ghz_report, histogram, latency_distribution
from bench.load.results import Results, merge
from bench.load.schedule import Plan
from bench.load.summary import summary
from bench.load.worker import Record

MS = 1_000_000  # ns
PLAN = Plan(
    target="127.0.0.1:1",
    method="/inference.GRPCInferenceService/ModelInfer",
    requests=(b"",),
    rps=100.0,
    total=10,
)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]


def results(latency_ms: list[float], code: list[int] | None = None, lag_ms: float = 0.0):
    n = len(latency_ms)
    code = code or [0] * n
    errors = ["rpc error: code = Unavailable desc = down"]
    return Results(
        plan=PLAN,
        start_wall=1_700_000_000.0,
        due=np.arange(n, dtype=np.int64) * 10 * MS,
        lag=np.full(n, int(lag_ms * MS), dtype=np.int64),
        latency=(np.array(latency_ms) * MS).astype(np.int64),
        code=np.array(code, dtype=np.int8),
        error=np.array([0 if c else -1 for c in code], dtype=np.int32),
        flags=np.zeros(n, dtype=np.int8),
        messages=errors,
        cpu=[(0.1, 1.0)],
        end_reason="normal",
    )


def test_percentiles_are_ghz_nearest_ranks_in_nanoseconds() -> None:
    got = latency_distribution(np.arange(1, 11) / 1000)  # 1..10 ms
    assert [p["percentage"] for p in got] == [10, 25, 50, 75, 90, 95, 99]
    assert [p["latency"] for p in got] == [v * MS for v in (1, 3, 5, 8, 9, 10, 10)]
    assert all(isinstance(p["latency"], int) for p in got)


def test_histogram_has_eleven_marks_in_seconds_and_counts_every_latency() -> None:
    latencies = np.sort(np.array([1, 1, 2, 5, 10, 10, 10], dtype=float) / 1000)
    buckets = histogram(latencies)
    assert len(buckets) == 11
    assert buckets[0]["mark"] == pytest.approx(0.001) and buckets[-1]["mark"] == 0.010
    assert sum(b["count"] for b in buckets) == len(latencies)
    assert buckets[0]["count"] == 2 and buckets[-1]["count"] == 3
    assert sum(b["frequency"] for b in buckets) == pytest.approx(1.0)


def test_report_fields_and_types_match_ghz() -> None:
    code = [0] * 8 + [UNAVAILABLE] * 2
    report = json.loads(json.dumps(ghz_report(results([5.0] * 4 + [7.0] * 6, code), {})))
    for key in ("count", "total", "average", "fastest", "slowest"):
        assert isinstance(report[key], int), key
    assert isinstance(report["rps"], float)
    assert report["count"] == 10
    assert report["statusCodeDistribution"] == {"OK": 8, "Unavailable": 2}
    assert report["errorDistribution"] == {"rpc error: code = Unavailable desc = down": 2}
    assert (report["fastest"], report["slowest"]) == (5 * MS, 7 * MS)  # answered ones only
    assert report["average"] == int(6.2 * MS)  # every request, as ghz averages
    assert report["total"] == 90 * MS + 7 * MS  # start to the last answer
    assert sum(b["count"] for b in report["histogram"]) == 8
    assert len(report["details"]) == 10 and report["details"][-1]["status"] == "Unavailable"
    assert report["date"].startswith("2023-11-14T") and report["endReason"] == "normal"


def test_a_run_with_no_answers_still_reports() -> None:
    report = ghz_report(results([1.0, 2.0], [UNAVAILABLE] * 2), {})
    assert report["latencyDistribution"] is None and report["histogram"] is None
    assert report["fastest"] == 0 and report["count"] == 2
    assert "Unavailable" in summary(report)


def test_lateness_and_busy_workers_are_warned_about() -> None:
    assert not results([1.0] * 10).warnings()
    late = results([1.0] * 10, lag_ms=50.0)
    assert any("behind schedule" in w for w in late.warnings())
    busy = results([1.0] * 10)
    busy.cpu = [(0.95, 1.0)]
    assert any("saturated" in w for w in busy.warnings())
    assert "WARNING" in summary(ghz_report(busy, {}))


def test_the_tools_cores_are_its_workers_shares_of_a_core_together() -> None:
    run = results([1.0] * 10)
    run.cpu = [(0.6, 2.0), (0.5, 1.0)]  # 30% and 50% of a core
    client = run.client()
    assert client["cores"] == pytest.approx(0.8) and client["busiestWorkerCpu"] == 0.5
    assert "1.10 CPU s (0.80 cores)" in summary(ghz_report(run, {}))


def test_workers_records_merge_with_their_errors_renumbered() -> None:
    first, second = Record(), Record()
    first.add(0.0, 0.0, 0.001, 0, None, 0)
    first.add(0.01, 0.0, 0.002, UNAVAILABLE, "rpc error: code = Unavailable desc = a", 0)
    second.add(0.005, 0.0, 0.003, UNAVAILABLE, "rpc error: code = Unavailable desc = b", 1)
    second.add(0.015, 0.0, 0.004, UNAVAILABLE, "rpc error: code = Unavailable desc = a", 0)
    merged = merge(PLAN, 0.0, [first, second])
    assert merged.count == 4 and merged.degraded() == 1
    assert merged.error_counts() == {
        "rpc error: code = Unavailable desc = a": 2,
        "rpc error: code = Unavailable desc = b": 1,
    }


def test_status_names_and_errors_read_as_go_prints_them() -> None:
    assert GO_NAMES[grpc.StatusCode.CANCELLED.value[0]] == "Canceled"
    assert GO_NAMES[grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]] == "ResourceExhausted"
    assert go_error(grpc.StatusCode.DEADLINE_EXCEEDED, "late") == (
        "rpc error: code = DeadlineExceeded desc = late"
    )


def test_refused_streams_point_at_too_few_connections() -> None:
    refused = results([1.0] * 10, [0] * 9 + [UNAVAILABLE])
    refused.messages = [
        "rpc error: code = Unavailable desc = Stream removed (Received RST_STREAM with "
        "error code 7 (RST_STREAM))"
    ]
    assert any("--connections" in w for w in refused.warnings())


def test_skip_first_leaves_out_the_earliest_answers_and_starts_the_clock_there() -> None:
    # Due every 10 ms; the first answer is slow, so the second and third come back first.
    run = results([50.0, 1.0, 1.0, 1.0, 1.0])
    kept = run.skip_first(2)
    assert kept.count == 3
    assert sorted(kept.latency.tolist()) == [1 * MS, 1 * MS, 50 * MS]  # the slow one came later
    # The window opens when the 2nd answer came back (21 ms) and closes at the last (50 ms).
    assert kept.total_seconds == pytest.approx(0.029)
    assert run.skip_first(0) is run and run.skip_first(9).count == 0
