"""ModelStatistics at the inference layer: the batcher's numbers for each model version.

They are kept in plain Python, cumulative counters and fixed-bucket histograms that only the
event loop thread updates, so reading them needs no lock: the v2 `ModelStatistics` RPC reads
them (`statistics_response`) and so does the Prometheus collector (services/inference/metrics.py).

`ModelStatistics` carries them in the protocol's own fields (request success and failure,
queue and compute time, one `batch_stats` entry per batch size). What the protocol has no
field for is carried in `response_stats` under `strata.` keys: `strata.rejected.<reason>`
(fail.count: requests answered without running, by reason) and `strata.queue` (success.count:
requests queued now; empty_response.count: rows queued now).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.v2stats import Duration, statistic
from strata.wire.v2stats import model_statistics as v2_statistics

# Seconds; from 50 microseconds (a tiny model's run) to 10 seconds (a queue far behind).
TIME_BUCKETS: tuple[float, ...] = (
    5e-05, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip

# Why a request was answered without running.
QUEUE_FULL = "queue_full"
DEADLINE = "deadline"
CANCELLED = "cancelled"
RETIRED = "retired"
REASONS = (QUEUE_FULL, DEADLINE, CANCELLED, RETIRED)


class Histogram:
    """Counts of observations at or below each bound, Prometheus-style, plus sum and count."""

    def __init__(self, bounds: Sequence[float] = TIME_BUCKETS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations at or below it) for every bucket, +Inf last."""
        out, running = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append((bound, running))
        return out

    def quantile(self, q: float) -> float:
        """An upper estimate of the q-quantile: the bound of the bucket that reaches it."""
        if not self.count:
            return 0.0
        target = q * self.count
        for bound, running in self.cumulative():
            if running >= target:
                return bound if bound != float("inf") else self.bounds[-1]
        return self.bounds[-1]


@dataclass
class VersionStats:
    """Everything the batcher records about one served model version."""

    name: str
    version: str
    success: Duration = field(default_factory=Duration)  # request time, queue to answer
    fail: Duration = field(default_factory=Duration)  # requests that ran and failed
    queue: Duration = field(default_factory=Duration)
    compute: Duration = field(default_factory=Duration)  # per request: its batch's run time
    queue_seconds: Histogram = field(default_factory=Histogram)
    execution_seconds: Histogram = field(default_factory=Histogram)  # per batch
    batch_sizes: Counter[int] = field(default_factory=Counter)  # rows -> batches run
    batch_compute: dict[int, Duration] = field(default_factory=dict)  # rows -> run time
    rejected: Counter[str] = field(default_factory=Counter)  # reason -> requests
    inference_count: int = 0  # rows answered
    execution_count: int = 0  # batches run
    last_inference_ms: int = 0
    queued_requests: int = 0  # gauges, kept current by the batcher
    queued_rows: int = 0
    queue_capacity_rows: int = 0  # the most rows its queue holds (batching.max_queue_rows)

    def record_batch(self, rows: int, seconds: float) -> None:
        """A batch of `rows` rows ran for `seconds` in ONNX Runtime."""
        self.batch_sizes[rows] += 1
        self.batch_compute.setdefault(rows, Duration()).add(seconds)
        self.execution_seconds.observe(seconds)
        self.execution_count += 1
        self.last_inference_ms = int(time.time() * 1000)

    def record_queued(self, seconds: float) -> None:
        """A request waited `seconds` before its batch started."""
        self.queue.add(seconds)
        self.queue_seconds.observe(seconds)

    def record_answer(self, rows: int, seconds: float, compute: float, ok: bool) -> None:
        """A request was answered `seconds` after it queued; its batch ran `compute`."""
        self.compute.add(compute)
        if ok:
            self.success.add(seconds)
            self.inference_count += rows
        else:
            self.fail.add(seconds)

    def reject(self, reason: str) -> None:
        """A request was answered without running, for `reason` (one of REASONS)."""
        self.rejected[reason] += 1


def _count(n: int) -> v2.StatisticDuration:
    return v2.StatisticDuration(count=n)


def model_statistics(stats: VersionStats) -> v2.ModelStatistics:
    """One version's numbers as v2 `ModelStatistics`."""
    message = v2_statistics(
        stats.name,
        stats.version,
        stats.last_inference_ms,
        stats.inference_count,
        stats.execution_count,
        success=stats.success,
        fail=stats.fail,
        queue=stats.queue,
        compute_infer=stats.compute,
    )
    message.batch_stats.extend(
        v2.InferBatchStatistics(batch_size=rows, compute_infer=statistic(stats.batch_compute[rows]))
        for rows in sorted(stats.batch_compute)
    )
    for reason in REASONS:
        message.response_stats[f"strata.rejected.{reason}"].fail.CopyFrom(
            _count(stats.rejected[reason])
        )
    queue = message.response_stats["strata.queue"]
    queue.success.CopyFrom(_count(stats.queued_requests))
    queue.empty_response.CopyFrom(_count(stats.queued_rows))
    return message


def statistics_response(stats: Iterable[VersionStats]) -> v2.ModelStatisticsResponse:
    return v2.ModelStatisticsResponse(model_stats=[model_statistics(s) for s in stats])
