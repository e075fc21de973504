"""A hop's own timeout, from how long that hop normally takes.

The caller's deadline says how long the caller will wait, not how long the next layer should
take: a hung process would hold every request sent to it until their callers give up. So each
hop's calls get `multiplier` times its recent P99 latency (never less than `floor_seconds`,
never more than `upstream_timeout_seconds`); a call that misses it is the hop's failure
(UNAVAILABLE: the breaker counts it and the flight fails over while its budget lasts).
"""

from __future__ import annotations

import numpy as np

from strata.config.gateway import HopTimeouts

RECOMPUTE_EVERY = 32  # answered calls between two P99 estimates


class HopTimer:
    def __init__(self, settings: HopTimeouts, ceiling: float) -> None:
        self.settings = settings
        self.ceiling = ceiling
        self.timeout = ceiling
        self._latencies = np.zeros(settings.window)
        self._seen = 0

    def observe(self, seconds: float) -> None:
        """An answered call's latency."""
        self._latencies[self._seen % len(self._latencies)] = seconds
        self._seen += 1
        if self._seen >= self.settings.min_samples and self._seen % RECOMPUTE_EVERY == 0:
            self._recompute()

    def configure(self, settings: HopTimeouts, ceiling: float) -> None:
        self.settings, self.ceiling = settings, ceiling
        if len(self._latencies) != settings.window:
            self._latencies, self._seen = np.zeros(settings.window), 0
        self.timeout = ceiling
        if self._seen >= settings.min_samples:
            self._recompute()

    def _recompute(self) -> None:
        recent = self._latencies[: min(self._seen, len(self._latencies))]
        p99 = float(np.percentile(recent, 99))
        wanted = max(self.settings.floor_seconds, self.settings.multiplier * p99)
        self.timeout = min(self.ceiling, wanted)
