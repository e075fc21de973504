"""What a client may hold open at a server, counted where gRPC cannot count it.

gRPC's own `maximum_concurrent_rpcs` counts every call, health checks included: 2,064 idle
streams once filled a gateway's 2,048 and then even `ServerLive` was refused. Here a server's
calls in flight are counted in Python instead, as each starts: at most `total` in all and, on a
public server, at most `per_client` from one address. Probes (health `Check`, `ServerLive`,
`ServerReady`) answer at once, so they are counted by neither; gRPC's own limit sits
`PROBE_RESERVE` calls above `total`, as the backstop and the probes' own capacity.

Every refusal, here and at the REST port, is counted in `strata_door_refused` by reason.
"""

from __future__ import annotations

import inspect
import types
from collections import Counter as Tally
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from prometheus_client import Counter

from strata.errors import RETRY_AFTER
from strata.security.bearer import source_address

REFUSED = Counter(
    "strata_door_refused",
    "Calls and connections refused before any work because a client, or all of them, held "
    "too many open, by reason (calls, calls_per_client, connections_per_client, "
    "streams_per_client, header_timeout).",
    ["reason"],
)
# Calls gRPC admits beyond `total`: room for probes while clients hold every other slot.
# Small, because gRPC refuses past its own limit before reading a message, while a call the
# server refuses has been read: a flood past `total` makes at most this many messages read and
# dropped at once. Probes come a few at a time.
PROBE_RESERVE = 16
# How long a refused caller should wait: a call in flight ends within about this long at
# capacity, so one of a full server's or a client's slots frees (trailing `retry-after-ms`).
RETRY_AFTER_MS = 100
HINT = ((RETRY_AFTER, str(RETRY_AFTER_MS)),)
PROBES = frozenset(
    {
        "grpc.health.v1.Health.Check",
        "inference.GRPCInferenceService.ServerLive",
        "inference.GRPCInferenceService.ServerReady",
    }
)


@dataclass(frozen=True)
class Gate:
    """What a call passes as it starts and ends: `enter(context)` may refuse it (abort) and
    returns what `leave` is given once it ends. Plain calls, not a context manager: entering
    and leaving `asynccontextmanager` cost 12 us a call here, these 2 us."""

    enter: Callable[[grpc.aio.ServicerContext[Any, Any]], Awaitable[Any]]
    leave: Callable[[Any], None] = lambda _entered: None


class Shares:
    """What each key (a client address, an identity) holds open, up to `limit` each."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit  # None: no limit
        self._held: Tally[str] = Tally()

    def take(self, key: str) -> bool:
        """Count one more for `key`, unless it already holds its limit."""
        if self.limit is not None and self._held[key] >= self.limit:
            return False
        self._held[key] += 1
        return True

    def give(self, key: str) -> None:
        self._held[key] -= 1
        if not self._held[key]:
            del self._held[key]


async def refuse(context: grpc.aio.ServicerContext[Any, Any], reason: str, message: str) -> None:
    """RESOURCE_EXHAUSTED with `message` and a retry hint, counted by `reason`."""
    REFUSED.labels(reason).inc()
    await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, message, trailing_metadata=HINT)


class Occupancy:
    """Calls in flight at one server, in all and by caller address."""

    def __init__(self, total: int, per_client: int | None) -> None:
        self._all = Shares(total)
        self._by_address = Shares(per_client)

    async def enter(self, context: grpc.aio.ServicerContext[Any, Any]) -> str:
        """Count a starting call as in flight (RESOURCE_EXHAUSTED instead when its address, or
        the server, holds its limit); its address, for `leave`."""
        address = source_address(context.peer() or "unknown")
        if not self._all.take(""):
            total = self._all.limit
            await refuse(context, "calls", f"this server runs at most {total} calls at once")
        if not self._by_address.take(address):
            self._all.give("")
            limit = self._by_address.limit
            await refuse(
                context,
                "calls_per_client",
                f"your address holds {limit} open calls, the most one address may; close one",
            )
        return address

    def leave(self, address: str) -> None:
        """A call from `address` has ended."""
        self._all.give("")
        self._by_address.give(address)

    def guard(self, servicer: object, service: str) -> object:
        """`servicer` with every method of `service` but the probes counted as they start."""
        return around_methods(servicer, service, Gate(self.enter, self.leave), PROBES)


def around_methods(
    servicer: object, service: str, gate: Gate, exempt: frozenset[str] = frozenset()
) -> object:
    """`servicer` with each method of `service` (but those named in `exempt`) passing `gate`,
    wrapped once at start-up: a server interceptor would run its whole pipeline in Python on
    every call."""
    methods = descriptor_pool.Default().FindServiceByName(service).methods
    return types.SimpleNamespace(
        **{
            m.name: (
                getattr(servicer, m.name)
                if m.full_name in exempt
                else _gated(getattr(servicer, m.name), gate)
            )
            for m in methods
        }
    )


def _gated(handler: Callable[..., Any], gate: Gate) -> Callable[..., Any]:
    enter, leave = gate.enter, gate.leave
    if inspect.isasyncgenfunction(handler):

        async def stream(
            request: object, context: grpc.aio.ServicerContext[Any, Any]
        ) -> AsyncIterator[object]:
            entered = await enter(context)
            try:
                async for reply in handler(request, context):
                    yield reply
            finally:
                leave(entered)

        return stream

    async def call(request: object, context: grpc.aio.ServicerContext[Any, Any]) -> object:
        entered = await enter(context)
        try:
            return await handler(request, context)
        finally:
            leave(entered)

    return call
