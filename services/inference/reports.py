"""v2 messages from the inference service's state: statistics and the repository index.

`ModelStatistics` carries the batcher's numbers in the protocol's own fields (request success
and failure, queue and compute time, one `batch_stats` entry per batch size). What the
protocol has no field for is carried in `response_stats` under `strata.` keys:
`strata.rejected.<reason>` (fail.count: requests answered without running, by reason) and
`strata.queue` (success.count: requests queued now; empty_response.count: rows queued now).
"""

from __future__ import annotations

from collections.abc import Iterable

from services.inference.manager import IndexEntry
from services.inference.stats import REASONS, Duration, VersionStats
from strata.proto.inference import grpc_service_pb2 as v2


def _duration(d: Duration) -> v2.StatisticDuration:
    return v2.StatisticDuration(count=d.count, ns=int(d.seconds * 1e9))


def _count(n: int) -> v2.StatisticDuration:
    return v2.StatisticDuration(count=n)


def model_statistics(stats: VersionStats) -> v2.ModelStatistics:
    """One version's numbers as v2 `ModelStatistics`."""
    message = v2.ModelStatistics(
        name=stats.name,
        version=stats.version,
        last_inference=stats.last_inference_ms,
        inference_count=stats.inference_count,
        execution_count=stats.execution_count,
        inference_stats=v2.InferStatistics(
            success=_duration(stats.success),
            fail=_duration(stats.fail),
            queue=_duration(stats.queue),
            compute_infer=_duration(stats.compute),
        ),
        batch_stats=[
            v2.InferBatchStatistics(
                batch_size=rows, compute_infer=_duration(stats.batch_compute[rows])
            )
            for rows in sorted(stats.batch_compute)
        ],
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


def index_response(entries: Iterable[IndexEntry]) -> v2.RepositoryIndexResponse:
    return v2.RepositoryIndexResponse(
        models=[
            v2.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in entries
        ]
    )
