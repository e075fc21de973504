"""v2 `ModelStatistics` from plain counts and times, for every layer that answers it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from strata.proto.inference import grpc_service_pb2 as v2


class Timed(Protocol):
    count: int
    seconds: float


@dataclass
class Duration:
    """A cumulative count and total time, as v2 `StatisticDuration` carries them."""

    count: int = 0
    seconds: float = 0.0

    def add(self, seconds: float, count: int = 1) -> None:
        """`count` more, that took `seconds` in all."""
        self.count += count
        self.seconds += seconds


def statistic(timed: Timed) -> v2.StatisticDuration:
    return v2.StatisticDuration(count=timed.count, ns=int(timed.seconds * 1e9))


def model_statistics(
    name: str,
    version: str,
    last_inference_ms: int,
    inference_count: int,
    execution_count: int,
    **inference_stats: Timed,
) -> v2.ModelStatistics:
    """One model version's numbers; `inference_stats` by their `InferStatistics` field names
    (success, fail, queue, compute_input, compute_infer, compute_output, cache_hit)."""
    return v2.ModelStatistics(
        name=name,
        version=version,
        last_inference=last_inference_ms,
        inference_count=inference_count,
        execution_count=execution_count,
        inference_stats=v2.InferStatistics(
            **{field: statistic(timed) for field, timed in inference_stats.items()}
        ),
    )
