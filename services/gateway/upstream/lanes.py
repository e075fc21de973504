"""A hop's calls as messages on long-lived bidirectional streams: lanes.

A unary gRPC call costs about twice what a message on an open stream costs, on both sides
(2-core VM: 0.25 against 0.16 ms of the caller's CPU, 0.32 against 0.19 ms of the server's,
0.49 against 0.29 ms round trip), and the gateway pays it on every hop of every flight. So
each hop keeps a few streams open to each replica and sends a call as a message on a lane
of the replica owing the fewest rows (`Spread`), and there on its lane owing the fewest
answers; the answer comes back with the message's tag. Where the replicas are known (local
replicas, each on its own address) each has a channel and lanes of its own, so neither idles
while the other holds a queue; behind one target that resolves to many (dns:///...) the
lanes share its channel, whose round-robin spreads them over the replicas as they open.

What a unary call had from gRPC, a lane does for itself:
- a message's deadline: its caller waits at most its timeout; a lane that misses a hop's
  own timeout (a hung replica) is cancelled and its replica takes no new messages for
  REST_SECONDS (as outlier detection ejects a replica), the other replicas' lanes and unary
  calls carrying on;
- a lane that breaks (its replica died or drained, the connection was cut) fails the
  messages it owes with `LaneBroken`: the hop sends them again as unary calls, which gRPC
  retries on another replica, and the next message opens a new lane;
- lanes open only on a channel that is ready (until then calls go unary, connecting it): a
  replica that is down or still starting gets no messages, and on a shared channel
  round-robin can spread the lanes over the replicas;
- a lane takes new messages for `lifetime` seconds (less a random part, so that lanes do
  not all turn over at once), then half-closes once its answers are in: well before the
  server's `max_connection_age` cuts its connection;
- a server without the stream method (UNIMPLEMENTED: any plain v2 server behind a route)
  gets unary calls from then on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import grpc
from google.protobuf.message import Message

from services.gateway.metrics import REPLICA_MESSAGES, REPLICA_RESTS
from strata.errors import DeadlineExceeded

log = logging.getLogger(__name__)

_TAGS = itertools.count(1)
REST_SECONDS = 5.0  # as gRPC's outlier detection first ejects a failing replica
Metadata = Sequence[tuple[str, str]]
Request = TypeVar("Request", bound=Message)  # a unary call's request, which the stream carries
Answer = TypeVar("Answer", bound=Message)  # the stream's message back
Reply = TypeVar("Reply", bound=Message)  # what the unary call would have returned


class LaneBroken(Exception):
    """The stream ended before it answered: the message may go again, elsewhere."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code


@dataclass(frozen=True)
class StreamMethod(Generic[Request, Answer, Reply]):
    """How one protocol's calls travel as stream messages."""

    open: Callable[[], grpc.aio.StreamStreamCall[Request, Answer]]
    name: str  # the stream method's, as its service names it
    answer: type[Answer]
    # The request as the stream carries it, with its tag, its timeout (seconds) and the
    # metadata a unary call would send (its trace context goes into the message).
    tag: Callable[[Request, int, float, Metadata], Request]
    tag_of: Callable[[Answer], int | None]
    # The reply a unary call would have returned, or the AioRpcError it would have raised.
    result: Callable[[Answer], Reply]


def rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    """The error a unary call would have raised, for a message's failure."""
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class Lane(Generic[Request, Answer, Reply]):
    """One open stream and the answers it still owes."""

    def __init__(self, method: StreamMethod[Request, Answer, Reply], expires: float) -> None:
        """A lane that takes new messages until `expires` (time.monotonic())."""
        self._method = method
        self.expires = expires
        self.accepting = True
        self.owed: dict[int, asyncio.Future[Answer]] = {}
        self.rows = 0  # the rows of the messages it owes answers to
        self._writing = asyncio.Lock()
        self._call = method.open()
        self._reader = asyncio.get_running_loop().create_task(self._read())
        self._closing: asyncio.Task[None] | None = None

    async def send(
        self, request: Request, timeout: float, metadata: Metadata = (), rows: int = 1
    ) -> Reply:
        """The reply to `request` (carrying `rows`), within `timeout` seconds."""
        tag = next(_TAGS)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Answer] = loop.create_future()
        self.owed[tag] = answer
        self.rows += rows
        limit = _Limit(answer)
        timer = loop.call_later(timeout, limit.expire)
        try:
            await self._write(self._method.tag(request, tag, timeout, metadata))
            limit.writing = False
            reply = await answer
        except asyncio.CancelledError:
            if not limit.uncancelled():
                raise
            raise _late() from None
        except _Expired:
            raise _late() from None
        finally:
            timer.cancel()
            self.owed.pop(tag, None)
            self.rows -= rows
            _settle(answer)
            self._close_if_done()
        return self._method.result(reply)

    def retire(self) -> None:
        """Take no new messages; half-close once every owed answer is in."""
        self.accepting = False
        self._close_if_done()

    def cancel(self) -> None:
        """End the stream now: what it owes fails with LaneBroken."""
        self.accepting = False
        self._call.cancel()

    async def _write(self, message: Request) -> None:
        async with self._writing:  # grpc.aio allows one write at a time per call
            if self._call.done():
                raise LaneBroken(grpc.StatusCode.UNAVAILABLE, "the stream had ended")
            try:
                await self._call.write(message)
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                raise LaneBroken(grpc.StatusCode.UNAVAILABLE, f"writing failed: {exc}") from None

    async def _read(self) -> None:
        ended = LaneBroken(grpc.StatusCode.UNAVAILABLE, "the stream ended before answering")
        try:
            while (read := await self._call.read()) is not grpc.aio.EOF:
                # types-grpcio types read() as `object | Answer` (EOF as object): no narrowing.
                reply = cast(Answer, read)
                tag = self._method.tag_of(reply)
                answer = None if tag is None else self.owed.get(tag)
                if answer is not None and not answer.done():
                    answer.set_result(reply)
        except grpc.aio.AioRpcError as exc:
            ended = LaneBroken(exc.code(), exc.details() or exc.code().name)
        except asyncio.CancelledError:
            ended = LaneBroken(grpc.StatusCode.UNAVAILABLE, "the stream was cancelled")
        finally:
            self.accepting = False
            for answer in self.owed.values():
                if not answer.done():
                    answer.set_exception(ended)

    def _close_if_done(self) -> None:
        if self.accepting or self.owed or self._closing is not None or self._call.done():
            return
        self._closing = asyncio.get_running_loop().create_task(self._half_close())

    async def _half_close(self) -> None:
        async with self._writing:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                await self._call.done_writing()  # unless it already ended


class _Expired(Exception):
    """A message's time ran out before its answer came."""


class _Limit:
    """A message's time limit, as asyncio.timeout's but for a fraction of its cost (3 hops a
    flight): when it passes, the answer fails, and a write still under way (its stream's flow
    control full, a replica that hangs) is cancelled."""

    __slots__ = ("_answer", "_cancelled", "_task", "writing")

    def __init__(self, answer: asyncio.Future[Any]) -> None:
        self._answer = answer
        self._task = asyncio.current_task()
        self._cancelled = False
        self.writing = True

    def expire(self) -> None:
        if self._answer.done():
            return
        self._answer.set_exception(_Expired())
        if self.writing and self._task is not None:
            self._cancelled = True
            self._task.cancel()

    def uncancelled(self) -> bool:
        """Whether the task's cancellation was this limit's alone (now undone), rather than
        its caller's."""
        if not self._cancelled or self._task is None:
            return False
        return self._task.uncancel() == 0


def _late() -> grpc.aio.AioRpcError:
    return rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer in time")


def _settle(answer: asyncio.Future[Answer]) -> None:
    """An answer this send will not await again: cancelled if still owed, or its error marked
    seen. The stream may end (and fail what it owes) while the message waits to be written;
    the write then raises its own error, and the answer's would be logged as never retrieved."""
    if not answer.done():
        answer.cancel()
    elif not answer.cancelled():
        answer.exception()


class Lanes(Generic[Request, Answer, Reply]):
    """One replica's lanes for one method (or, behind a shared channel, every replica's);
    `count` of them at most, each open `lifetime` seconds."""

    def __init__(
        self,
        name: str,
        method: StreamMethod[Request, Answer, Reply],
        count: int,
        lifetime: float,
        ready: Callable[[], bool] = lambda: True,
        labels: tuple[str, str] = ("", ""),
    ) -> None:
        """Lanes opened by `method` while `ready()` says their channel is connected;
        `labels`, its hop and replica in the metrics."""
        self.name = name
        self.labels = labels
        self._method = method
        self._lifetime = lifetime
        self._ready = ready
        self._lanes: list[Lane[Request, Answer, Reply] | None] = [None] * count
        self._rests_until = 0.0  # time.monotonic() until which a condemned replica rests
        self.usable = count > 0

    @property
    def rows(self) -> int:
        """The rows of every message its lanes owe answers to."""
        return sum(lane.rows for lane in self._lanes if lane is not None)

    def open(self) -> bool:
        """Whether it takes messages now: it has the stream method, has not missed a hop
        timeout lately, and its channel is connected (lanes opened while it connects would
        fail, or, on a shared channel, all go to the first replica up)."""
        return self.usable and self._rests_until <= time.monotonic() and self._ready()

    async def call(
        self,
        request: Request,
        timeout: float,
        cancel_on_timeout: bool,
        metadata: Metadata = (),
        rows: int = 1,
    ) -> Reply:
        """The reply to `request` (carrying `rows`) over a lane. LaneBroken: send it some
        other way; `cancel_on_timeout`: a missed timeout condemns the lane (the hop's own
        timeout)."""
        if self._rests_until > time.monotonic():
            raise LaneBroken(grpc.StatusCode.UNAVAILABLE, f"{self.name} rests after a timeout")
        if not self._ready():
            raise LaneBroken(grpc.StatusCode.UNAVAILABLE, f"{self.name} is still connecting")
        lane = self._pick()
        try:
            return await lane.send(request, timeout, metadata, rows)
        except LaneBroken as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED and self.usable:
                self.usable = False
                log.warning("%s serves no stream method; unary calls from now on", self.name)
            raise
        except grpc.aio.AioRpcError as exc:
            if cancel_on_timeout and exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                self._condemn(lane)
            raise

    def close(self) -> None:
        for lane in self._lanes:
            if lane is not None:
                lane.cancel()

    def _condemn(self, lane: Lane[Request, Answer, Reply]) -> None:
        """Cancel a lane that missed the hop's own timeout (its replica hangs, or is far
        slower than the others) and rest a while, as outlier detection would eject the
        replica, so that the next messages do not go straight back to it."""
        lane.cancel()
        if lane in self._lanes:
            self._lanes[self._lanes.index(lane)] = None
        self._rests_until = time.monotonic() + REST_SECONDS
        REPLICA_RESTS.labels(*self.labels).inc()
        log.warning("%s missed the hop's timeout: it rests %.0fs", self.name, REST_SECONDS)

    def _pick(self) -> Lane[Request, Answer, Reply]:
        """The lane owing the fewest answers (the first among equals), after replacing any
        that ended or expired."""
        now = time.monotonic()
        for index, lane in enumerate(self._lanes):
            if lane is None or not lane.accepting or lane.expires <= now:
                if lane is not None:
                    lane.retire()
                expires = now + self._lifetime * random.uniform(0.5, 1.0)
                self._lanes[index] = Lane(self._method, expires)
        return min((lane for lane in self._lanes if lane), key=lambda lane: len(lane.owed))


class Spread(Generic[Request, Answer, Reply]):
    """A hop's lanes for one method over its replicas: each call to the replica owing the
    fewest rows, the replicas taking turns among equals (so that light load reaches every
    replica too).

    With `held` set, a replica is sent at most that many messages at once: the next call waits
    in the gateway and goes to the first replica to answer one. A message sent at once to the
    replica owing the fewest rows waits in that replica's queue even when the other replica,
    sharing its core with less or finishing sooner, then idles: a flight's parts waited on the
    slower replica while the other had nothing (tens of ms a flight of 1280x960 photos). Two
    held messages keep the next one in the replica's hands while it works on the current one,
    so the replica does not idle for the round trip either."""

    def __init__(self, replicas: Sequence[Lanes[Request, Answer, Reply]], held: int = 0) -> None:
        """`held`: messages each replica is sent at once (0: no bound)."""
        self.replicas = list(replicas)
        self._turn = 0
        self._held = held
        self._holding = [0] * len(self.replicas)  # messages sent to each (or promised it)
        self._held_gauges = [REPLICA_MESSAGES.labels(*r.labels) for r in self.replicas]
        self._waiting: deque[asyncio.Future[int]] = deque()  # calls waiting for a replica

    @property
    def usable(self) -> bool:
        """Whether any replica serves the stream method."""
        return any(replica.usable for replica in self.replicas)

    @property
    def taking(self) -> int:
        """How many replicas take messages now."""
        return sum(replica.open() for replica in self.replicas)

    async def call(
        self,
        request: Request,
        timeout: float,
        cancel_on_timeout: bool,
        metadata: Metadata = (),
        rows: int = 1,
        *,
        patience: float | None = None,
        claimed: Callable[[], None] | None = None,
    ) -> Reply:
        """The reply to `request` from the least loaded replica that takes messages and has
        room for one, within `timeout` once sent; LaneBroken where none takes messages (the
        hop then calls unary). It waits for room at most `patience` seconds (the caller's
        budget; by default `timeout`), then fails with DeadlineExceeded: a wait in the
        gateway says nothing about a replica, so it is not the hop's own timeout missed.
        `claimed` is told once a replica is chosen, so the hop times the replica from then."""
        patience = timeout if patience is None else patience
        started = time.monotonic()
        index = await self._claim(patience)
        if claimed is not None:
            claimed()
        try:
            left = patience - (time.monotonic() - started)
            # Where the caller's budget, shortened by the wait, ends first, a late answer is
            # the caller's deadline passing, not the replica missing the hop's own timeout.
            condemns = cancel_on_timeout and timeout < left
            replica = self.replicas[index]
            self._held_gauges[index].set(self._holding[index])
            return await replica.call(request, min(timeout, left), condemns, metadata, rows)
        finally:
            self._holding[index] -= 1
            self._held_gauges[index].set(self._holding[index])
            self._hand_on()

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    async def _claim(self, timeout: float) -> int:
        """The replica the next message goes to, counted as holding it."""
        index = None if self._waiting else self._pick()
        if index is not None:
            self._holding[index] += 1
            return index
        loop = asyncio.get_running_loop()
        promised: asyncio.Future[int] = loop.create_future()
        self._waiting.append(promised)
        timer = loop.call_later(timeout, _time_up, promised)
        try:
            return await promised
        except asyncio.CancelledError:
            if promised.done() and not promised.cancelled() and promised.exception() is None:
                self._holding[promised.result()] -= 1  # promised as its caller gave up
                self._hand_on()
            raise
        finally:
            timer.cancel()
            with contextlib.suppress(ValueError):
                self._waiting.remove(promised)

    def _hand_on(self) -> None:
        """Each waiting call, oldest first, promised a replica with room while one has it;
        where no replica takes messages any more, the calls waiting go another way."""
        while self._waiting:
            try:
                index = self._pick()
            except LaneBroken as exc:
                for promised in self._waiting:
                    if not promised.done():
                        promised.set_exception(exc)
                self._waiting.clear()
                return
            if index is None:
                return
            promised = self._waiting.popleft()
            if not promised.done():
                self._holding[index] += 1
                promised.set_result(index)

    def _pick(self) -> int | None:
        """The replica (its index) that takes messages, has room for one and owes the fewest
        rows; None where every one that takes messages is full."""
        count = len(self.replicas)
        self._turn = (self._turn + 1) % count
        order = [(self._turn + step) % count for step in range(count)]
        taking = [i for i in order if self.replicas[i].open()]
        if not taking:
            raise LaneBroken(grpc.StatusCode.UNAVAILABLE, "no replica's lanes take messages")
        room = [i for i in taking if not self._held or self._holding[i] < self._held]
        if not room:
            return None
        return min(room, key=lambda i: self.replicas[i].rows)


def _time_up(promised: asyncio.Future[int]) -> None:
    if not promised.done():
        promised.set_exception(DeadlineExceeded("deadline passed waiting for a replica with room"))
