"""ghz's JSON report, field for field, so scripts and dashboards that read ghz read this.

As in ghz: durations are integer nanoseconds; `average` is over every request, `fastest`,
`slowest`, `histogram` and `latencyDistribution` over the answered (OK) ones; percentiles
are ghz's nearest-rank values, not interpolated; histogram marks are seconds. What ghz has
no field for (open or closed loop, the load tool's own CPU use, degraded answers) is under
`strata`, which ghz readers ignore.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import numpy as np

from bench.load.codes import GO_NAMES
from bench.load.results import Results

PERCENTAGES = (10, 25, 50, 75, 90, 95, 99)
BUCKETS = 10
MAX_DETAILS = 1_000_000  # ghz keeps at most this many per-request details


def latency_distribution(ok_seconds: np.ndarray) -> list[dict[str, int]]:
    """ghz's nearest-rank percentiles of sorted latencies (seconds) as nanoseconds."""
    n = len(ok_seconds)
    out = []
    for p in PERCENTAGES:
        rank = p / 100 * n
        index = int(rank)
        if rank == index:
            index -= 1
        value = ok_seconds[max(index, 0)] if n else 0.0
        out.append({"percentage": p, "latency": int(value * 1e9)})
    return out


def histogram(ok_seconds: np.ndarray) -> list[dict[str, float | int]]:
    """ghz's histogram: 11 marks from fastest to slowest; each latency in the first mark >= it."""
    if not len(ok_seconds):
        return []
    fastest, slowest = float(ok_seconds[0]), float(ok_seconds[-1])
    step = (slowest - fastest) / BUCKETS
    marks = np.array([fastest + step * i for i in range(BUCKETS)] + [slowest])
    index = np.minimum(np.searchsorted(marks, ok_seconds, side="left"), BUCKETS)
    counts = np.bincount(index, minlength=BUCKETS + 1)
    return [
        {"mark": float(m), "count": int(c), "frequency": float(c) / len(ok_seconds)}
        for m, c in zip(marks, counts, strict=True)
    ]


def ghz_report(results: Results, options: dict[str, Any], name: str = "") -> dict[str, Any]:
    """The report of one run, with ghz's fields and types."""
    ok = results.ok_latencies()
    count = results.count
    average = float(results.latency.sum()) / count if count else 0.0
    report: dict[str, Any] = {
        "date": _rfc3339(results.start_wall),
        "endReason": results.end_reason,
        "options": options,
        "count": count,
        "total": int(results.total_seconds * 1e9),
        "average": int(average),
        "fastest": int(ok[0] * 1e9) if len(ok) else 0,
        "slowest": int(ok[-1] * 1e9) if len(ok) else 0,
        "rps": count / results.total_seconds if results.total_seconds else 0.0,
        "errorDistribution": dict(results.error_counts()),
        "statusCodeDistribution": dict(results.codes()),
        "latencyDistribution": latency_distribution(ok) if len(ok) else None,
        "histogram": histogram(ok) if len(ok) else None,
        "details": details(results),
        "strata": strata_extras(results),
    }
    if name:
        report["name"] = name
    return report


def details(results: Results) -> list[dict[str, Any]]:
    """One entry per request, as ghz writes them (timestamp, latency ns, error, status)."""
    order = np.argsort(results.due, kind="stable")[:MAX_DETAILS]
    out = []
    for i in order:
        error = int(results.error[i])
        out.append(
            {
                "timestamp": _rfc3339(results.start_wall + results.due[i] / 1e9, nanos=True),
                "latency": int(results.latency[i]),
                "error": results.messages[error] if error >= 0 else "",
                "status": GO_NAMES[int(results.code[i])],
            }
        )
    return out


def strata_extras(results: Results) -> dict[str, Any]:
    plan = results.plan
    return {
        "loop": "open" if plan.open_loop else "closed",
        "sender": plan.sender,
        "offeredRps": plan.rps,
        "answeredRps": results.throughput(),
        "degraded": results.degraded(),
        "cached": results.cached(),
        "client": results.client(),
        "warnings": results.warnings(),
    }


def ghz_options(options: Any, plan: Any, data: object) -> dict[str, Any]:
    """ghz's `options` object for a run described by CLI options and its plan."""
    out = {
        "host": plan.target,
        "call": plan.method if plan.http else plan.method.strip("/").replace("/", "."),
        "insecure": plan.tls is None,
        "skipFirst": options.skip_first,
        "total": plan.expected or 0,
        "concurrency": plan.concurrency or 0,
        "rps": plan.rps or 0,
        "connections": plan.connections,
        "duration": int((plan.duration or 0) * 1e9),
        "timeout": int((plan.timeout or 0) * 1e9),
        "dial-timeout": int(plan.connect_timeout * 1e9),
        "data": data,
        "binary": options.binary_file is not None,
        "metadata": dict(plan.metadata) or None,
        "CPUs": options.workers,
    }
    if plan.tls is not None and plan.tls.server_name:
        out["cname"] = plan.tls.server_name
    if options.name:
        out["name"] = options.name
    return out


def _rfc3339(seconds: float, nanos: bool = False) -> str:
    moment = dt.datetime.fromtimestamp(seconds, dt.UTC).astimezone()
    if nanos:
        return moment.isoformat(timespec="microseconds")
    return moment.isoformat(timespec="seconds")
