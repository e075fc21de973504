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
from services.inference.stats import REASONS, VersionStats
from strata.proto.inference import grpc_service_pb2 as v2
from strata.v2stats import model_statistics as v2_statistics
from strata.v2stats import statistic


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


def index_response(entries: Iterable[IndexEntry]) -> v2.RepositoryIndexResponse:
    return v2.RepositoryIndexResponse(
        models=[
            v2.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in entries
        ]
    )
