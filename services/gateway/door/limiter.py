"""Token-bucket rate limiting: one bucket per client, per peer address, and for the gateway.

A request takes a token from each bucket that applies to it, or from none: a client over its
own limit never spends the shared budget, so one client flooding cannot starve the others.
Callers without a registered API key are limited by their peer address as well, with
`peer_clients` times a client's bucket, so that inventing client ids does not buy more.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from strata.config.gateway import RateLimits, TokenBucket

# The shortest retry hint: a bucket a hair short of its next token would say "retry in 0 s",
# and the clients it refused (eight sharing a key, say) would come back at once, together.
RETRY_FLOOR_SECONDS = 0.01


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


class Buckets:
    """Buckets by key, of one spec, the least recently seen dropped beyond `max_keys`."""

    def __init__(self, spec: TokenBucket | None, max_keys: int) -> None:
        self._by_key: OrderedDict[str, Bucket] = OrderedDict()
        self.configure(spec, max_keys)

    def configure(self, spec: TokenBucket | None, max_keys: int) -> None:
        """A new spec (None: no limit); existing keys keep their tokens up to the new burst."""
        self.spec, self.max_keys = spec, max_keys
        if spec is None:
            self._by_key.clear()
            return
        for bucket in self._by_key.values():
            bucket.rate, bucket.burst = spec.rate, spec.burst
            bucket.tokens = min(bucket.tokens, bucket.burst)

    def get(self, key: str, now: float) -> Bucket | None:
        """The key's bucket; None where there is no limit."""
        if self.spec is None:
            return None
        bucket = self._by_key.get(key)
        if bucket is None:
            bucket = self._by_key[key] = Bucket(self.spec, now)
            if len(self._by_key) > self.max_keys:
                self._by_key.popitem(last=False)
        else:
            self._by_key.move_to_end(key)
        return bucket


class RateLimiter:
    """Admits or refuses requests by client and peer; limits can change at run time."""

    def __init__(self, limits: RateLimits, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._clients = Buckets(None, limits.max_clients)
        self._peers = Buckets(None, limits.max_clients)
        self.configure(limits)

    def configure(self, limits: RateLimits) -> None:
        """Apply new limits; existing clients and peers keep their tokens up to the new burst."""
        self.limits = limits
        self._total = Bucket(limits.total, self._clock()) if limits.total else None
        self._clients.configure(limits.per_client, limits.max_clients)
        self._peers.configure(_scaled(limits.per_client, limits.peer_clients), limits.max_clients)

    def admit(self, client: str, peer: str | None = None) -> tuple[bool, float, str]:
        """(admitted, seconds to wait before retrying: until the refusing bucket's next token,
        and at least RETRY_FLOOR_SECONDS; which limit refused); `peer` is the caller's
        address when it has no registered API key."""
        now = self._clock()
        found = [("client", self._clients.get(client, now)), ("total", self._total)]
        if peer is not None:  # a peer's spec is the client's, scaled: both set or neither
            found.insert(1, ("peer", self._peers.get(peer, now)))
        buckets = [(scope, bucket) for scope, bucket in found if bucket is not None]
        for scope, bucket in buckets:
            bucket.refill(now)
            if bucket.tokens < 1.0:
                return False, max(RETRY_FLOOR_SECONDS, bucket.wait()), scope
        for _, bucket in buckets:
            bucket.tokens -= 1.0
        return True, 0.0, ""


def _scaled(spec: TokenBucket | None, factor: float) -> TokenBucket | None:
    if spec is None:
        return None
    return TokenBucket(rate=spec.rate * factor, burst=spec.burst * factor)
