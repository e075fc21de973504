"""The degradation ladder: live load signals move the gateway between levels, with hysteresis.

Levels: 0 normal; 1 core postprocess rules only; 2 inference skips batching; 3 answers from
the cache or the pipeline's default answer, marked degraded; 4 shed load with
RESOURCE_EXHAUSTED. Pressure is the worst of in-flight requests against the concurrency
limit, the event loop's lag (work queued before any handler starts), each pipeline's
recent P95 latency against its objective, the upstream error share and the
queue-rejection share, each scaled so that 1 means "at the limit". The level steps up
after `up_after` ticks at pressure >= 1 and down after `down_after` ticks below `down_below`.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from services.gateway.metrics import SHED
from strata.errors import Overloaded
from strata.policies import Ladder

log = logging.getLogger(__name__)

LEVELS = ("normal", "core_rules_only", "skip_batching", "cache_or_default", "shed")
MIN_SAMPLES = 5


@dataclass(frozen=True)
class Outcome:
    at: float
    pipeline: str
    seconds: float
    kind: str  # "ok", "error" (upstream unwell) or "rejected" (a full queue upstream)


class Signals:
    """What the ladder watches: in-flight count and a window of recent outcomes."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.inflight = 0
        self.loop_lag = 0.0  # seconds the event loop last fell behind its tick
        self._clock = clock
        self._outcomes: deque[Outcome] = deque()

    def record(self, pipeline: str, seconds: float, kind: str) -> None:
        self._outcomes.append(Outcome(self._clock(), pipeline, seconds, kind))

    def window(self, seconds: float) -> list[Outcome]:
        horizon = self._clock() - seconds
        while self._outcomes and self._outcomes[0].at < horizon:
            self._outcomes.popleft()
        return list(self._outcomes)


def pressure(
    signals: Signals, settings: Ladder, objectives: Mapping[str, float]
) -> dict[str, float]:
    """Each signal's pressure (1.0 = at its limit)."""
    recent = signals.window(settings.window_seconds)
    parts = {
        "concurrency": signals.inflight / settings.concurrency_limit,
        "event_loop": signals.loop_lag * 1000 / settings.loop_lag_limit_ms,
    }
    if len(recent) >= MIN_SAMPLES:
        errors = sum(o.kind == "error" for o in recent) / len(recent)
        rejected = sum(o.kind == "rejected" for o in recent) / len(recent)
        parts["errors"] = errors / settings.error_rate_limit
        parts["rejections"] = rejected / settings.rejection_rate_limit
    for pipeline, objective in objectives.items():
        latencies = [o.seconds for o in recent if o.pipeline == pipeline and o.kind == "ok"]
        if len(latencies) >= MIN_SAMPLES:
            parts[f"latency:{pipeline}"] = float(np.percentile(latencies, 95)) / objective
    return parts


class LadderController:
    """Decides the level once per tick; a forced level overrides the signals."""

    def __init__(
        self,
        settings: Ladder,
        objectives: Mapping[str, float],
        on_change: Callable[[int, int, str], None] = lambda old, new, why: None,
    ) -> None:
        self.settings = settings
        self.objectives = dict(objectives)
        self.signals = Signals()
        self.level = 0
        self.forced: int | None = None
        self.last_pressure: dict[str, float] = {}
        self._on_change = on_change
        self._above = 0
        self._calm = 0

    def force(self, level: int | None) -> None:
        """Pin the ladder at `level`, or release it (None) to follow the signals again."""
        self.forced = level
        if level is not None:
            self._move(level, "forced from the admin API")

    def tick(self) -> int:
        self.last_pressure = pressure(self.signals, self.settings, self.objectives)
        if self.forced is not None:
            return self.level
        worst = max(self.last_pressure.values())
        if worst >= 1.0:
            self._above, self._calm = self._above + 1, 0
            if self._above >= self.settings.up_after and self.level < self.settings.max_level:
                self._move(self.level + 1, self._reason())
        elif worst < self.settings.down_below:
            self._above, self._calm = 0, self._calm + 1
            if self._calm >= self.settings.down_after and self.level > 0:
                self._move(self.level - 1, f"calm (pressure {worst:.2f})")
        else:
            self._above = self._calm = 0
        return self.level

    def admit(self, level: int) -> None:
        """Shed the request (RESOURCE_EXHAUSTED with a retry hint) when the gateway already
        holds its limit of requests; at the shedding level the limit shrinks."""
        settings = self.settings
        limit = settings.concurrency_limit
        if level >= 4:
            limit = max(1, int(limit * settings.shed_admit_fraction))
        if self.signals.inflight >= limit:
            reason = "level" if level >= 4 else "concurrency"
            SHED.labels(reason).inc()
            raise Overloaded(
                f"gateway overloaded ({limit} requests in flight); retry later",
                settings.shed_retry_ms / 1000,
            )

    def _reason(self) -> str:
        name, value = max(self.last_pressure.items(), key=lambda item: item[1])
        return f"{name} pressure {value:.2f}"

    def _move(self, level: int, why: str) -> None:
        old, self.level = self.level, level
        self._above = self._calm = 0
        if old != level:
            log.warning("degradation level %d -> %d (%s): %s", old, level, LEVELS[level], why)
            self._on_change(old, level, why)
