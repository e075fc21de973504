"""Token-bucket rate limiting: one bucket per client and one for the whole gateway.

A request takes a token from its client's bucket and from the total bucket, or from neither:
a client over its own limit never spends the shared budget, so one client flooding cannot
starve the others.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from strata.policies import RateLimits, TokenBucket


class Bucket:
    """Tokens refill at `rate` per second up to `burst`."""

    def __init__(self, spec: TokenBucket, now: float) -> None:
        self.rate = spec.rate
        self.burst = spec.burst
        self.tokens = spec.burst
        self.stamp = now

    def refill(self, now: float) -> None:
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now

    def wait(self) -> float:
        """Seconds until one token is there (0 if one is there now)."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


class RateLimiter:
    """Admits or refuses requests by client; limits can change at run time."""

    def __init__(self, limits: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients: OrderedDict[str, Bucket] = OrderedDict()
        self.configure(limits)

    def configure(self, limits: RateLimits) -> None:
        """Apply new limits; existing clients keep their tokens up to the new burst."""
        self.limits = limits
        now = self._clock()
        self._total = Bucket(limits.total, now) if limits.total else None
        for bucket in self._clients.values():
            if limits.per_client:
                bucket.rate, bucket.burst = limits.per_client.rate, limits.per_client.burst
                bucket.tokens = min(bucket.tokens, bucket.burst)
        if not limits.per_client:
            self._clients.clear()

    def admit(self, client: str) -> tuple[bool, float, str]:
        """(admitted, seconds to wait before retrying, which limit refused)."""
        now = self._clock()
        buckets = []
        if self.limits.per_client:
            buckets.append(("client", self._client_bucket(client, now)))
        if self._total is not None:
            buckets.append(("total", self._total))
        for scope, bucket in buckets:
            bucket.refill(now)
            if bucket.tokens < 1.0:
                return False, bucket.wait(), scope
        for _, bucket in buckets:
            bucket.tokens -= 1.0
        return True, 0.0, ""

    def _client_bucket(self, client: str, now: float) -> Bucket:
        bucket = self._clients.get(client)
        if bucket is None:
            bucket = self._clients[client] = Bucket(self.limits.per_client, now)
            if len(self._clients) > self.limits.max_clients:
                self._clients.popitem(last=False)
        else:
            self._clients.move_to_end(client)
        return bucket
