"""Per-stage durations for preprocess steps and postprocess rules.

A pipeline calls `record(pipeline, stage, seconds)` after each stage, from whichever thread ran
it; this keeps a small in-memory summary per (pipeline, stage) and feeds a Prometheus
histogram. Other exporters subscribe with `add_hook` instead of being wired into pipelines.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Histogram

from strata.telemetry.metrics import LATENCY_BUCKETS, Children

# (pipeline, stage, seconds)
Hook = Callable[[str, str, float], None]


@dataclass
class Summary:
    """What one stage of one pipeline has cost so far."""

    count: int = 0
    total_seconds: float = 0.0
    max_seconds: float = 0.0


class Timings:
    """Thread-safe per-(pipeline, stage) duration summaries, a histogram, and hooks."""

    def __init__(self, histogram: Histogram | None = None) -> None:
        self._lock = threading.Lock()
        self._summaries: dict[tuple[str, str], Summary] = {}
        self._hooks: list[Hook] = []
        # Each (pipeline, stage)'s child resolved once: labels() per stage per call cost
        # about as much again as the observation.
        self._histogram = Children(histogram) if histogram is not None else None

    def add_hook(self, hook: Hook) -> None:
        """Call `hook(pipeline, stage, seconds)` for every stage run from now on."""
        self._hooks.append(hook)

    def record(self, pipeline: str, stage: str, seconds: float) -> None:
        with self._lock:
            summary = self._summaries.setdefault((pipeline, stage), Summary())
            summary.count += 1
            summary.total_seconds += seconds
            summary.max_seconds = max(summary.max_seconds, seconds)
        if self._histogram is not None:
            self._histogram(pipeline, stage).observe(seconds)
        for hook in self._hooks:
            hook(pipeline, stage, seconds)

    def snapshot(self) -> dict[tuple[str, str], Summary]:
        """A copy of every summary, keyed by (pipeline, stage)."""
        with self._lock:
            return {key: Summary(**vars(value)) for key, value in self._summaries.items()}


def stage_histogram(layer: str, stage: str) -> Histogram:
    """`strata_<layer>_<stage>_duration_seconds{pipeline, <stage>}`."""
    return Histogram(
        f"strata_{layer}_{stage}_duration_seconds",
        f"Time each {layer} {stage} took, by pipeline.",
        ["pipeline", stage],
        buckets=LATENCY_BUCKETS,
    )
