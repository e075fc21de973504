"""Rule durations and overruns: small in-memory counts, and hooks that see every event.

The engine calls `record(pipeline, rule, seconds)` after every rule (from its worker thread)
and `overrun(pipeline, rule)` for every rule skipped at its time limit. Exporters (Prometheus
counters and histograms, span events) subscribe with `add_hook` / `add_overrun_hook`.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

DurationHook = Callable[[str, str, float], None]  # (pipeline, rule, seconds)
OverrunHook = Callable[[str, str], None]  # (pipeline, rule)


@dataclass
class Summary:
    """What one rule of one pipeline has cost so far."""

    count: int = 0
    total_seconds: float = 0.0
    max_seconds: float = 0.0


class RuleMetrics:
    """Thread-safe per-(pipeline, rule) durations and overrun counts, plus hooks."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._durations: dict[tuple[str, str], Summary] = {}
        self._overruns: Counter[tuple[str, str]] = Counter()
        self._duration_hooks: list[DurationHook] = []
        self._overrun_hooks: list[OverrunHook] = []
        self.stuck_threads = 0  # threads still held by abandoned rules (engine updates it)

    def add_hook(self, hook: DurationHook) -> None:
        self._duration_hooks.append(hook)

    def add_overrun_hook(self, hook: OverrunHook) -> None:
        self._overrun_hooks.append(hook)

    def record(self, pipeline: str, rule: str, seconds: float) -> None:
        with self._lock:
            summary = self._durations.setdefault((pipeline, rule), Summary())
            summary.count += 1
            summary.total_seconds += seconds
            summary.max_seconds = max(summary.max_seconds, seconds)
        for hook in self._duration_hooks:
            hook(pipeline, rule, seconds)

    def overrun(self, pipeline: str, rule: str) -> None:
        with self._lock:
            self._overruns[(pipeline, rule)] += 1
        for hook in self._overrun_hooks:
            hook(pipeline, rule)

    def durations(self) -> dict[tuple[str, str], Summary]:
        with self._lock:
            return {key: Summary(**vars(value)) for key, value in self._durations.items()}

    def overruns(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._overruns)
