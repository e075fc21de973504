"""Flights: concurrent client requests that travel the chain together.

A flight is one preprocess call, one inference call and one postprocess call for a group of
client requests that must share them (same pipeline, arm, model version, level, input row
shapes and parameters), each request keeping its own rows, result, error, deadline and trace.

Departure. At most `max_in_air` flights travel at once (a pipeline's own `max_in_air`, where it
sets one, when its flight is the next to leave). A key with nothing in the air is
calm: its request leaves at once, with whatever arrived in the same event-loop turn, so a
lone request never waits for company. While some of a key's requests are in the air, its next
flight leaves once it holds its share of the key's load: the requests the key recently had in
the system (in the air and queued, counted as each flight of it lands, averaged), over
`max_in_air`; or once it is full; or once its first request has waited `linger` of the key's
recent time in the air (waiting out a whole share left one flight in the air while the rest
came back through the gateway: 70-150 ms for 31 sentences at 64 in flight); or when the key's
flights have all landed. Leaving as soon as
a flight slot was free sent the first request back from a landed flight alone, while the rest
gathered behind it: with 16 in flight, flights of 1 and 15 took turns, so one replica of a
layer worked through the big flight while the other served the lone one, and the gateway,
inference and postprocess paid per flight for one request (docs/gateway.md, Flights).

Bounds. A flight takes the key's oldest waiting requests, up to `max_requests` requests and
`max_rows` rows, and within the room its hops and its model leave
(services/gateway/flow/sizing.py): more goes in the next flight, never fails. A request whose
caller gave up or whose deadline passed leaves its queue without costing a layer anything.

Traces: a flight of one request is part of that request's trace, like any call. A flight of
many is part of its first sampled request's trace (its lead's), and each other sampled
request's span links to the lead's; each request's context travels with its rows, and every
layer's span of the flight's calls links to the spans of the requests it carried.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Iterator
from dataclasses import dataclass, field

from opentelemetry import context as otel_context
from opentelemetry import trace

from services.gateway.flow.sizing import UNBOUNDED, Room
from services.gateway.metrics import FLIGHT_REQUESTS, FLIGHTS_IN_AIR
from services.gateway.request import Answer, ClientRequest
from strata.config.gateway import FlightSettings
from strata.errors import DeadlineExceeded
from strata.telemetry import propagation
from strata.wire.deadline import Deadline


@dataclass(eq=False)
class Member:
    """One client request aboard a flight."""

    request: ClientRequest
    rows: int
    deadline: Deadline
    context: otel_context.Context = field(default_factory=otel_context.get_current)
    size: int = 0  # its inputs' bytes
    future: asyncio.Future[Answer] = field(init=False)

    boarded: float = field(default=0.0, init=False)  # time.monotonic()
    _carrier: dict[str, str] | None = field(default=None, init=False)

    def carrier(self) -> dict[str, str]:
        """Its W3C trace context (traceparent, tracestate), made once."""
        if self._carrier is None:
            self._carrier = {}
            propagation.inject(self._carrier, context=self.context)
        return self._carrier

    @property
    def waiting(self) -> bool:
        """Whether its caller still waits for it (not cancelled, not past its deadline)."""
        return not self.future.done()

    def fail(self, exc: BaseException) -> None:
        """Its answer is `exc`, where its caller still waits for one."""
        if self.waiting:
            self.future.set_exception(exc)


# Weight of each landing in a key's averages: about the last four flights of it.
LANDING_WEIGHT = 0.25


@dataclass(eq=False)
class _Line:
    """One key's queue, its requests in the air, and its recent load."""

    queue: deque[Member] = field(default_factory=deque)
    aboard: int = 0  # its requests in flights now in the air
    load: float = 0.0  # its requests in the air and queued as its flights land, averaged
    air: float = 0.0  # seconds its flights spent in the air, averaged
    waking: asyncio.TimerHandle | None = None  # ends the wait of its gathering flight

    def landed(self, members: int, seconds: float) -> None:
        self.load = _average(self.load, self.aboard + len(self.queue))
        self.air = _average(self.air, seconds)
        self.aboard -= members


def _average(average: float, value: float) -> float:
    return value if not average else average + (value - average) * LANDING_WEIGHT


# Carries a flight through the chain, answering (or failing) each member's future.
Fly = Callable[[list[Member]], Awaitable[None]]
# Told of each member as its flight leaves, with the seconds it waited for it.
Departed = Callable[[Member, float], None]


class Flights:
    """Queues of requests by what they must share, and the flights that leave from them."""

    def __init__(
        self,
        settings: FlightSettings,
        fly: Fly,
        departed: Departed,
        room: Callable[[Member], Room] = lambda member: UNBOUNDED,
        most: Callable[[Member], int | None] = lambda member: None,
    ) -> None:
        """Flights carried by `fly`, `departed` told of each member as it leaves; `room`:
        what a flight of a member's kind may carry; `most`: the flights in the air that a
        member's kind leaves beside, where not `settings.max_in_air`."""
        self.settings = settings
        self._fly = fly
        self._departed = departed
        self._room = room
        self._most = most
        self._lines: dict[Hashable, _Line] = {}  # in turn order
        self._in_air = 0
        self._pump_soon = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._numbers = itertools.count(1)

    def configure(self, settings: FlightSettings) -> None:
        """New bounds for the flights that leave from now on."""
        self.settings = settings

    async def board(self, key: Hashable, member: Member) -> Answer:
        """Queue `member` for the next flight of `key` and wait for its answer."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        member.future = future
        member.boarded = time.monotonic()
        line = self._lines.get(key)
        if line is None:
            line = self._lines[key] = _Line()
        line.queue.append(member)
        if not self._pump_soon:
            self._pump_soon = True
            loop.call_soon(self._pump)
        # A timer that fails the future, not asyncio.timeout, which also cancels and
        # uncancels the waiting task: that cost 0.85% of the gateway's CPU at 16 in flight.
        timer = loop.call_later(member.deadline.left(), _expire, future)
        try:
            return await future
        finally:
            timer.cancel()
            if not future.done():
                future.cancel()

    def _pump(self) -> None:
        self._pump_soon = False
        launched = True
        while launched:
            launched = False
            for key, line in list(self._lines.items()):
                if line.queue and self._in_air >= self._in_air_most(line):
                    continue
                group = self._take(line)
                if group:
                    del self._lines[key]
                    self._lines[key] = line  # to the back: keys take turns
                    self._launch(key, line, group)
                    launched = True
                elif not line.queue and not line.aboard:
                    del self._lines[key]

    def _in_air_most(self, line: _Line) -> int:
        """The flights that may be in the air when the next of `line` leaves."""
        most = self._most(line.queue[0])
        return self.settings.max_in_air if most is None else most

    def _take(self, line: _Line) -> list[Member]:
        """The flight that leaves `line` now: its oldest waiting members within a flight's
        bounds, where the key is calm, they fill a flight, or they are its share of the
        key's load (module docstring); none otherwise."""
        group, scanned, full = self._fill(line.queue)
        if group and line.aboard and not full and self._gathers(line, group):
            return []
        for _ in range(scanned):
            line.queue.popleft()
        return group

    def _gathers(self, line: _Line, group: list[Member]) -> bool:
        """Whether a busy key's next flight, `group` so far, waits for more: below its share
        of the key's load and for less than `linger` of the key's time in the air (a timer
        then ends the wait)."""
        share = min(int(line.load / self._in_air_most(line)), self.settings.max_requests)
        if len(group) >= share:
            return False
        left = group[0].boarded + line.air * self.settings.linger - time.monotonic()
        if left <= 0:
            return False
        if line.waking is None:
            line.waking = asyncio.get_running_loop().call_later(left, self._wake, line)
        return True

    def _wake(self, line: _Line) -> None:
        line.waking = None
        self._pump()

    def _fill(self, queue: deque[Member]) -> tuple[list[Member], int, bool]:
        """The oldest waiting members of `queue` one flight carries, how many of the queue's
        first members they span (with those whose callers have gone), and whether a bound
        stopped them before the queue's end."""
        group: list[Member] = []
        rows = size = scanned = 0
        limits = self.settings
        room = UNBOUNDED
        for member in queue:
            if len(group) == limits.max_requests:
                return group, scanned, True
            if not member.waiting:
                scanned += 1
                continue
            if not group:
                room = self._room(member)
            elif rows + member.rows > limits.max_rows or not room.fits(
                len(group) + 1, rows + member.rows, size + member.size
            ):
                return group, scanned, True
            group.append(member)
            scanned += 1
            rows += member.rows
            size += member.size
        return group, scanned, len(group) == limits.max_requests

    def _launch(self, key: Hashable, line: _Line, group: list[Member]) -> None:
        now = time.monotonic()
        for member in group:
            self._departed(member, now - member.boarded)
        self._in_air += 1
        line.aboard += len(group)
        if line.waking is not None:
            line.waking.cancel()
            line.waking = None
        FLIGHTS_IN_AIR.set(self._in_air)
        FLIGHT_REQUESTS.observe(len(group))
        # A flight of one runs in its request's context; a flight of many in none of theirs.
        context = contextvars.copy_context() if len(group) == 1 else contextvars.Context()
        if len(group) == 1:
            context.run(otel_context.attach, group[0].context)
        task = asyncio.get_running_loop().create_task(
            self._run(key, line, group, now), context=context
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, key: Hashable, line: _Line, group: list[Member], left: float) -> None:
        try:
            if len(group) == 1:
                await self._fly(group)
            else:
                with _lead_trace(group, next(self._numbers)):
                    await self._fly(group)
        except Exception as exc:  # the whole flight failed: each member hears why
            for member in group:
                if member.waiting:
                    member.future.set_exception(exc)
        finally:
            self._in_air -= 1
            FLIGHTS_IN_AIR.set(self._in_air)
            line.landed(len(group), time.monotonic() - left)
            if not line.queue and not line.aboard and self._lines.get(key) is line:
                del self._lines[key]
            self._pump()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _expire(future: asyncio.Future[Answer]) -> None:
    if not future.done():
        future.set_exception(DeadlineExceeded("deadline passed before the chain answered"))


@contextlib.contextmanager
def _lead_trace(group: list[Member], number: int) -> Iterator[None]:
    """A flight of many in the trace of its first sampled member, its lead: the layers'
    spans of its calls are children of the lead's span (and link to every request they
    carried), the lead's span says which flight it led and how many it carried, and each
    other sampled member's span links to the lead's; nothing when no member is sampled."""
    sampled = [s for s in (trace.get_current_span(m.context) for m in group) if s.is_recording()]
    if not sampled:
        yield
        return
    lead, *others = sampled
    lead.set_attributes({"strata.flight": number, "strata.flight_requests": len(group)})
    led_by = lead.get_span_context()
    for span in others:
        span.add_link(led_by, {"strata.flight": number})
    token = otel_context.attach(trace.set_span_in_context(lead))
    try:
        yield
    finally:
        otel_context.detach(token)
