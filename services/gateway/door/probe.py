"""The gateway's own probe of the wait before its door.

Past capacity, calls wait in gRPC's own queue before any handler runs: the grpc.aio server
accepts one new call per turn of its event loop, so the excess queues where no handler sees
it (docs/gateway.md, "Past capacity"). The gateway measures that wait itself: it binds a Unix
socket of its own on the public server (its calls join the same queue as every client's) and
sends a health check through it once per ladder tick, one at a time, timing each from send
to answer. Nothing a client sends (its deadlines above all) enters the measurement; only
the queue that every client shares, and the event loop that answers them, can lengthen it.
The time the event loop's thread waited meanwhile for a CPU is taken off each time
(backlog.py): a machine short of cores delays the probe as much, with no call queued before
the door.

The socket is made in a folder only the gateway's user can open (mode 0700), so that it
admits no one the public port would refuse: whoever can open it could read the gateway's
keys as well.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.door.backlog import Backlog
from services.gateway.door.ladder import Signals

log = logging.getLogger(__name__)

# A probe still unanswered after this long is a wait at least this long: recorded as such.
TIMEOUT_SECONDS = 10.0
# A probe that waited this share of the interval or more is followed at once: the door
# refuses from its reading while calls wait, and should stop as soon as they no longer do.
BUSY_SHARE = 0.25
# Reconnect within a second once the server is up (gRPC's own backoff grows to 2 minutes).
RECONNECT = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000)]


class DoorProbe:
    """Times a health check through the public server's door once per `interval()` seconds,
    or again at once after one that waited a quarter of that or more (the door refuses on
    arrival from this reading: backlog.py), and gives each time, less the event loop's lag,
    to `signals` and `backlog`. Started with the gateway's runtime, before the server: until
    the server binds `address` its probes find no one and count for nothing."""

    def __init__(self, signals: Signals, backlog: Backlog, interval: Callable[[], float]) -> None:
        self._signals = signals
        self._backlog = backlog
        self._interval = interval
        self._folder = Path(tempfile.mkdtemp(prefix="strata-door-"))
        self.address = f"unix:{self._folder / 'door.sock'}"
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._probe_forever())

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        shutil.rmtree(self._folder, ignore_errors=True)

    async def _probe_forever(self) -> None:
        async with grpc.aio.insecure_channel(self.address, options=RECONNECT) as channel:
            # The health stubs declare HealthStub without its methods (sync and aio differ).
            check = health_pb2_grpc.HealthStub(channel).Check  # type: ignore[attr-defined]
            while True:
                started = time.monotonic()
                self._backlog.sent()
                waited = await _timed(check, started)
                if waited is None:
                    self._backlog.lost()
                    waited = 0.0
                else:
                    self._signals.probed(self._backlog.answered(waited))
                interval = self._interval()
                if waited < BUSY_SHARE * interval:
                    await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def _timed(
    check: Callable[..., Awaitable[health_pb2.HealthCheckResponse]], started: float
) -> float | None:
    """Seconds from `started` to the answer of one health check (any answer: the call got
    through the door); None where it never reached the server (not yet, or no longer, up)."""
    try:
        await check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_SECONDS)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            return None
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            log.debug("door probe answered %s", exc.code().name)
    return time.monotonic() - started
