"""Bearer tokens for the control calls: the gateway's Admin API, inference's model load/unload.

A control call must carry the configured token as `authorization: Bearer <token>` metadata;
it is compared in constant time and never logged. Where no token is configured, the calls are
off (closed by default).

Guessing is throttled per source address: after `FAILURES` missing or wrong tokens within
`WINDOW` seconds, the address is refused RESOURCE_EXHAUSTED for `BACKOFF` seconds without its
token being checked at all. Each failure is logged at WARNING with the caller's address.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc

from strata.errors import Overloaded, PermissionDenied, Unauthenticated
from strata.telemetry.propagation import call_metadata

log = logging.getLogger(__name__)

FAILURES = 5  # failed attempts from one address...
WINDOW = 60.0  # ...within this many seconds...
BACKOFF = 60.0  # ...refuse that address for this long
MAX_SOURCES = 10_000  # addresses remembered; the least recently failed go first


class ControlOff(PermissionDenied):
    """A control call this server's config does not enable: no caller may make it."""


@dataclass
class _Source:
    failures: deque[float]
    until: float = field(default=0.0)


class Throttle:
    """Failed attempts per source: `failures` within `window` seconds block the source for
    `backoff` seconds. Memory is bounded by `max_sources`."""

    def __init__(
        self,
        failures: int = FAILURES,
        window: float = WINDOW,
        backoff: float = BACKOFF,
        max_sources: int = MAX_SOURCES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limit, self._window, self._backoff = failures, window, backoff
        self._max_sources, self._clock = max_sources, clock
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def wait(self, source: str) -> float:
        """Seconds before `source`'s next attempt is checked (0: it is checked now)."""
        entry = self._sources.get(source)
        return max(0.0, entry.until - self._clock()) if entry else 0.0

    def failed(self, source: str) -> bool:
        """Count a failure of `source`; True when it starts a backoff."""
        now = self._clock()
        entry = self._sources.pop(source, None) or _Source(deque(maxlen=self._limit))
        self._sources[source] = entry
        while len(self._sources) > self._max_sources:
            self._sources.popitem(last=False)
        entry.failures.append(now)
        if len(entry.failures) < self._limit or now - entry.failures[0] > self._window:
            return False
        entry.failures.clear()
        entry.until = now + self._backoff
        return True

    def succeeded(self, source: str) -> None:
        """Forget `source`'s failures: it holds the token."""
        self._sources.pop(source, None)


def source_address(peer: str) -> str:
    """The caller's address without its port, from gRPC's `ipv4:10.0.0.1:5123` form."""
    return peer.rsplit(":", 1)[0]


class ControlAuth:
    """The check a server's control calls make: a configured token, carried by the call,
    from an address that has not failed too often. `token` is read at every call, so a
    reloaded config's token applies at once."""

    def __init__(
        self,
        calls: str,
        setting: str,
        token: Callable[[], str | None],
        throttle: Throttle | None = None,
    ) -> None:
        self._calls, self._setting, self._token = calls, setting, token
        self._throttle = throttle or Throttle()

    def check(self, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        """Let the gRPC call through only if it carries the token (`allow`)."""
        self.allow(context.peer() or "unknown", call_metadata(context))

    def allow(self, peer: str, metadata: Mapping[str, str]) -> None:
        """Let a call from `peer` (gRPC's form) through only if its `metadata` (gRPC
        metadata or HTTP headers, names in lower case) carries the token.

        PERMISSION_DENIED, naming the setting that enables the calls, when no token is
        configured; RESOURCE_EXHAUSTED while the caller's address is backing off;
        UNAUTHENTICATED when the call's token is missing or wrong.
        """
        token = self._token()
        if not token:
            raise ControlOff(
                f"{self._calls} is off on this server: set {self._setting} to enable it, and "
                "send the token as 'authorization: Bearer <token>' metadata"
            )
        source = source_address(peer)
        wait = self._throttle.wait(source)
        if wait:
            raise Overloaded(f"{self._calls}: too many failed attempts; retry later", wait)
        scheme, _, sent = metadata.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(sent.encode(), token.encode()):
            self._throttle.succeeded(source)
            return
        blocked = self._throttle.failed(source)
        log.warning(
            "%s: missing or wrong admin token from %s%s",
            self._calls,
            source,
            f"; refusing that address for {self._throttle.wait(source):.0f}s" if blocked else "",
        )
        raise Unauthenticated(f"{self._calls}: missing or wrong admin token")
