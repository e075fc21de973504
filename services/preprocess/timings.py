"""Per-step durations: a small in-memory summary, and hooks that see every measurement.

The pipeline calls `record(pipeline, step, seconds)` after each step, from whichever thread
ran it. Exporters (Prometheus histograms, span events) subscribe with `add_hook` instead of
being wired into the pipeline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

# (pipeline, step, seconds)
Hook = Callable[[str, str, float], None]


@dataclass
class Summary:
    """What one step of one pipeline has cost so far."""

    count: int = 0
    total_seconds: float = 0.0
    max_seconds: float = 0.0

    @property
    def mean_seconds(self) -> float:
        return self.total_seconds / self.count if self.count else 0.0


class StepTimings:
    """Thread-safe per-(pipeline, step) duration summaries, plus subscriber hooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._summaries: dict[tuple[str, str], Summary] = {}
        self._hooks: list[Hook] = []

    def add_hook(self, hook: Hook) -> None:
        """Call `hook(pipeline, step, seconds)` for every step run from now on."""
        self._hooks.append(hook)

    def record(self, pipeline: str, step: str, seconds: float) -> None:
        with self._lock:
            summary = self._summaries.setdefault((pipeline, step), Summary())
            summary.count += 1
            summary.total_seconds += seconds
            summary.max_seconds = max(summary.max_seconds, seconds)
        for hook in self._hooks:
            hook(pipeline, step, seconds)

    def snapshot(self) -> dict[tuple[str, str], Summary]:
        """A copy of every summary, keyed by (pipeline, step)."""
        with self._lock:
            return {key: Summary(**vars(value)) for key, value in self._summaries.items()}
