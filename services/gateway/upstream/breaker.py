"""Circuit breakers: stop calling an upstream that keeps failing, probe it before trusting it.

Closed: calls flow, consecutive failures are counted. Open: calls fail fast with UNAVAILABLE
until `open_seconds` pass. Half-open: one probe call goes through; its success closes the
breaker, its failure opens it again.

An upstream keeps one breaker per key: an inference deployment one per model, so a model that
is not loaded there opens its own circuit and not the deployment's other models'.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import grpc

from strata.config.gateway import Breaker

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


class Breakers:
    """An upstream's circuit breakers by key, made on first use; settings reload live."""

    def __init__(
        self, name: str, settings: Breaker, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._by_key: dict[str, CircuitBreaker] = {}

    @property
    def settings(self) -> Breaker:
        return self._settings

    @settings.setter
    def settings(self, settings: Breaker) -> None:
        self._settings = settings
        for breaker in self._by_key.values():
            breaker.settings = settings

    def __getitem__(self, key: str) -> CircuitBreaker:
        breaker = self._by_key.get(key)
        if breaker is None:
            label = f"{self.name}/{key}" if key else self.name
            breaker = self._by_key[key] = CircuitBreaker(label, self._settings, self._clock)
        return breaker

    def state(self, key: str = "") -> str:
        breaker = self._by_key.get(key)
        return "closed" if breaker is None else breaker.state

    def available_for(self, key: str) -> bool:
        breaker = self._by_key.get(key)
        return breaker is None or breaker.available

    @property
    def available(self) -> bool:
        """Whether a call of the upstream's own (not about one model) could go now; an
        inference deployment's calls each have their model's circuit (`available_for`)."""
        return self.available_for("")
