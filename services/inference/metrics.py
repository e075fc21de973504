"""Prometheus metrics of the batcher, read from the served versions' statistics at scrape time.

The batcher keeps its numbers in plain Python (statistics.py) for the v2 ModelStatistics RPC;
this collector turns the same objects into Prometheus families, so there is one source of truth.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import Counter
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import REGISTRY

from services.inference.statistics import REASONS, Histogram, VersionStats

LABELS = ["deployment", "model", "version"]
# An inference deployment's name, and what reads its model versions' statistics.
Source = tuple[str, Callable[[], list[VersionStats]]]


def _histogram(name: str, doc: str, rows: list[tuple[list[str], Histogram]]) -> Metric:
    family = HistogramMetricFamily(name, doc, labels=LABELS)
    for labels, histogram in rows:
        buckets = [
            ("+Inf" if bound == float("inf") else repr(bound), count)
            for bound, count in histogram.cumulative()
        ]
        family.add_metric(labels, buckets, histogram.sum)
    return family


def _batch_sizes(rows: list[tuple[list[str], VersionStats]]) -> Metric:
    family = HistogramMetricFamily(
        "strata_inference_batch_rows", "Rows in each batch run, by model version.", labels=LABELS
    )
    bounds = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for labels, s in rows:
        cumulative, total = [], 0
        for bound in bounds:
            total = sum(n for rows, n in s.batch_sizes.items() if rows <= bound)
            cumulative.append((str(bound), total))
        cumulative.append(("+Inf", sum(s.batch_sizes.values())))
        rows_sum = sum(rows * n for rows, n in s.batch_sizes.items())
        family.add_metric(labels, cumulative, rows_sum)
    return family


class BatcherCollector:
    """Collects `strata_inference_*` from whatever versions serve at scrape time."""

    def __init__(self) -> None:
        self.sources: list[Source] = []

    def collect(self) -> Iterator[Metric]:
        rows = [
            ([deployment, s.name, s.version], s)
            for deployment, statistics in list(self.sources)
            for s in statistics()
        ]
        yield _batch_sizes(rows)
        yield _histogram(
            "strata_inference_queue_seconds",
            "Time a request waited before its batch started.",
            [(labels, s.queue_seconds) for labels, s in rows],
        )
        yield _histogram(
            "strata_inference_execution_seconds",
            "Time each batch took to run.",
            [(labels, s.execution_seconds) for labels, s in rows],
        )
        queued = GaugeMetricFamily(
            "strata_inference_queue_rows", "Rows waiting in the queue now.", labels=LABELS
        )
        capacity = GaugeMetricFamily(
            "strata_inference_queue_capacity_rows",
            "The most rows the queue holds (batching.max_queue_rows); past it, refusals.",
            labels=LABELS,
        )
        answered = CounterMetricFamily(
            "strata_inference_requests",
            "Requests that ran, by outcome.",
            labels=[*LABELS, "outcome"],
        )
        rejected = CounterMetricFamily(
            "strata_inference_rejections",
            "Requests answered without running, by reason.",
            labels=[*LABELS, "reason"],
        )
        for labels, s in rows:
            queued.add_metric(labels, s.queued_rows)
            capacity.add_metric(labels, s.queue_capacity_rows)
            answered.add_metric([*labels, "ok"], s.success.count)
            answered.add_metric([*labels, "error"], s.fail.count)
            for reason in REASONS:
                rejected.add_metric([*labels, reason], s.rejected[reason])
        yield from (queued, capacity, answered, rejected)


LOAD_FAILURES = Counter(
    "strata_inference_load_failures",
    "Model versions refused at load (they failed to open, validate, warm or fit their "
    "pipelines), by model and version; 0 for each version tried, so alerts see it.",
    ["model", "version"],
)

COLLECTOR = BatcherCollector()
REGISTRY.register(COLLECTOR)


def watch(statistics: Callable[[], list[VersionStats]], deployment: str) -> Callable[[], None]:
    """Export a model manager's statistics, labelled with the inference deployment it
    serves; returns the function that stops it."""
    source = (deployment, statistics)
    COLLECTOR.sources.append(source)
    return lambda: COLLECTOR.sources.remove(source)
