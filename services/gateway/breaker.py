"""Circuit breakers: stop calling an upstream that keeps failing, probe it before trusting it.

Closed: calls flow, consecutive failures are counted. Open: calls fail fast with UNAVAILABLE
until `open_seconds` pass. Half-open: one probe call goes through; its success closes the
breaker, its failure opens it again.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from strata.policies import Breaker

# Codes that say the upstream itself is unwell; any other answer proves it is up, except a
# call we gave up on (cancelled, or out of budget), which says nothing either way.
FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}
)
NEUTRAL = frozenset({grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED})


class CircuitBreaker:
    def __init__(
        self, name: str, settings: Breaker, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self.settings = settings
        self._clock = clock
        self._failures = 0
        self._open_until = 0.0
        self._probing = False

    @property
    def state(self) -> str:
        if self._failures < self.settings.failures:
            return "closed"
        return "half_open" if self._clock() >= self._open_until else "open"

    @property
    def available(self) -> bool:
        """Whether a call could go now, without taking the half-open probe."""
        state = self.state
        return state == "closed" or (state == "half_open" and not self._probing)

    def allow(self) -> bool:
        """Whether a call may go now (in half-open state, only the one probe)."""
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._probing:
            self._probing = True
            return True
        return False

    def record(self, code: grpc.StatusCode) -> None:
        """Count the outcome of a call that `allow` let through."""
        self._probing = False
        if code in NEUTRAL:
            return
        if code in FAILURES:
            self._failures += 1
            if self._failures >= self.settings.failures:
                self._open_until = self._clock() + self.settings.open_seconds
        else:
            self._failures = 0
