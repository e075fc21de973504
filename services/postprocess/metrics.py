"""Rule durations and overruns: small in-memory counts, and hooks that see every event.

The engine calls `record(pipeline, rule, seconds)` after every rule (from its worker thread)
and `overrun(pipeline, rule)` for every rule skipped at its time limit; both feed Prometheus
(`strata_postprocess_rule_duration_seconds`, `strata_postprocess_rule_overruns_total`), and
other exporters subscribe with `add_hook` / `add_overrun_hook`.
"""

from __future__ import annotations

from collections import Counter as CountOf
from collections.abc import Callable

from prometheus_client import Counter, Gauge

from strata.telemetry.timings import Timings, stage_histogram

OverrunHook = Callable[[str, str], None]  # (pipeline, rule)


RULE_SECONDS = stage_histogram("postprocess", "rule")
OVERRUNS = Counter(
    "strata_postprocess_rule_overruns",
    "Rules abandoned at their time limit, by pipeline and rule.",
    ["pipeline", "rule"],
)
STUCK = Gauge("strata_postprocess_stuck_threads", "Worker threads still held by abandoned rules.")


class RuleMetrics(Timings):
    """Rule durations (see strata.telemetry.timings) plus overrun counts and their hooks."""

    def __init__(self) -> None:
        super().__init__(RULE_SECONDS)
        self._overruns: CountOf[tuple[str, str]] = CountOf()
        self._overrun_hooks: list[OverrunHook] = []
        self._stuck = 0

    @property
    def stuck_threads(self) -> int:
        """Threads still held by abandoned rules (the engine updates it)."""
        return self._stuck

    @stuck_threads.setter
    def stuck_threads(self, value: int) -> None:
        self._stuck = value
        STUCK.set(value)

    def add_overrun_hook(self, hook: OverrunHook) -> None:
        self._overrun_hooks.append(hook)

    def overrun(self, pipeline: str, rule: str) -> None:
        with self._lock:
            self._overruns[(pipeline, rule)] += 1
        OVERRUNS.labels(pipeline, rule).inc()
        for hook in self._overrun_hooks:
            hook(pipeline, rule)

    def overruns(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return dict(self._overruns)
