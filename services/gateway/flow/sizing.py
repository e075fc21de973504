"""How big a flight may grow: what its hops can carry and what its model takes in one batch.

Every message between the layers is bounded by gRPC's limit (`server.max_message_bytes`), and
preprocess may answer far more than it was sent: a 50 KB JPEG becomes 600 KB of FP32 pixels.
So the gateway learns, for each pipeline arm (pipeline, deployment, model version), the most
bytes per row any message of its recent flights carried after the client's own inputs (each
layer's answer and the request postprocess gets), and a flight takes requests only while its
client inputs and its rows times that stay within the limit, less `message_margin` of it (a
row larger than recent ones, each message's framing). Until one flight of the arm has been
answered nothing is known, and flights carry one request each. A flight also carries no more
rows than the model takes in one batch: its `max_batch_size`, asked once of the deployment
(v2 ModelConfig; a server that does not answer it leaves only `max_rows`).

A request that alone would overflow a message is refused INVALID_ARGUMENT, naming the limit,
before any hop where its size is known, else when the hop refuses it.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import sys
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from services.gateway.request import ClientRequest
from strata.errors import InvalidArgument, StrataError

log = logging.getLogger(__name__)
RECENT = 256  # messages whose bytes per row the estimate is the largest of
TOO_LARGE = "message larger than max"  # gRPC's words when a message passes the limit


@dataclass(frozen=True)
class Room:
    """What one flight of an arm may carry: rows, client input bytes, and rows times the
    largest bytes per row its messages were seen to carry (None: not known yet)."""

    rows: int
    message_bytes: int
    row_bytes: float | None

    def fits(self, requests: int, rows: int, input_bytes: int) -> bool:
        """Whether a flight of `requests` requests, `rows` rows and `input_bytes` of client
        inputs stays within it (a flight of one always does: a request too large alone was
        refused before it boarded)."""
        if requests <= 1:
            return True
        if self.row_bytes is None:
            return False
        within = rows * self.row_bytes <= self.message_bytes
        return rows <= self.rows and input_bytes <= self.message_bytes and within


UNBOUNDED = Room(sys.maxsize, sys.maxsize, 0.0)

# (deployment, model, version): the model's max_batch_size there, or None if it does not say.
BatchLimit = Callable[[str, str, str], Awaitable[int | None]]


@dataclass(frozen=True)
class Arm:
    """What flights of the same size share: the pipeline and where its model runs."""

    pipeline: str
    deployment: str
    model: str
    version: str


class Heaviest:
    """The most bytes per row among one arm's last RECENT messages, and among those of them
    that were measured: a sliding-window maximum, amortised O(1) a message (scanning the
    window each message cost the gateway ~3% of its CPU at 16 in flight)."""

    def __init__(self) -> None:
        self._count = 0
        # (message number, bytes per row), the weights falling from the front: the front is
        # the window's maximum, and a message later and heavier drops those before it.
        self._all: deque[tuple[int, float]] = deque()
        self._measured: deque[tuple[int, float]] = deque()

    def add(self, weight: float, measured: bool) -> None:
        self._count += 1
        _push(self._all, self._count, weight)
        if measured:
            _push(self._measured, self._count, weight)
        oldest = self._count - RECENT
        for peaks in (self._all, self._measured):
            while peaks and peaks[0][0] <= oldest:
                peaks.popleft()

    @property
    def largest(self) -> float | None:
        """Overflows' shares included; None before any message."""
        return self._all[0][1] if self._all else None

    @property
    def measured(self) -> float:
        """Of measured messages only; 0.0 before any."""
        return self._measured[0][1] if self._measured else 0.0


def _push(peaks: deque[tuple[int, float]], number: int, weight: float) -> None:
    while peaks and peaks[-1][1] <= weight:
        peaks.pop()
    peaks.append((number, weight))


class Sizes:
    """Learned bytes per row and asked batch limits, by arm."""

    def __init__(self, limit: int, margin: float, batch_limit: BatchLimit) -> None:
        self._limit = limit
        self._budget = int(limit * (1 - margin))
        self._batch_limit = batch_limit
        self._seen: dict[Arm, Heaviest] = {}
        self._batches: dict[tuple[str, str, str], int | None] = {}
        self._asking: set[asyncio.Task[None]] = set()

    def configure(self, limit: int, margin: float) -> None:
        self._limit, self._budget = limit, int(limit * (1 - margin))

    def room(self, arm: Arm) -> Room:
        """What a flight of `arm` may carry now."""
        where = (arm.deployment, arm.model, arm.version)
        if where not in self._batches:
            self._ask(where)
            return Room(1, self._budget, None)  # flights of one until the model says
        batch = self._batches[where]
        rows = UNBOUNDED.rows if batch is None else max(batch, 1)
        heaviest = self._seen.get(arm)
        return Room(rows, self._budget, heaviest.largest if heaviest else None)

    def saw(self, arm: Arm, rows: int, size: int, measured: bool = True) -> None:
        """A message of `size` bytes carrying `rows` rows went between two layers for `arm`
        (not `measured`: a share of the limit it passed, its true size unknown)."""
        if rows <= 0:
            return
        heaviest = self._seen.get(arm)
        if heaviest is None:
            heaviest = self._seen[arm] = Heaviest()
        heaviest.add(size / rows, measured)

    def overflowed(self, arm: Arm, rows: int) -> None:
        """A message of `rows` rows passed the limit: each row takes at least its share (for
        sizing flights only: one heavy row may have made it pass)."""
        self.saw(arm, rows, self._limit + 1, measured=False)

    def refuse_alone(self, arm: Arm, rows: int, input_bytes: int) -> None:
        """Raise InvalidArgument if a request of `rows` rows and `input_bytes` would overflow
        a message even in a flight of its own, as far as measured messages tell."""
        heaviest = self._seen.get(arm)
        made = rows * (heaviest.measured if heaviest else 0.0)
        if input_bytes > self._limit or made > self._limit:
            raise too_large(rows, max(input_bytes, int(made)), self._limit)

    def _ask(self, where: tuple[str, str, str]) -> None:
        if any(task.get_name() == repr(where) for task in self._asking):
            return
        # In a context of its own: the question is no request's work, nor in its trace.
        learning = self._learn(where)
        loop = asyncio.get_running_loop()
        task = loop.create_task(learning, name=repr(where), context=contextvars.Context())
        self._asking.add(task)
        task.add_done_callback(self._asking.discard)

    async def _learn(self, where: tuple[str, str, str]) -> None:
        try:
            self._batches[where] = await self._batch_limit(*where)
        except StrataError as exc:  # not reachable now: asked again by the next flight
            log.info(
                "max_batch_size of model %s on %s unknown for now: %s", where[1], where[0], exc
            )

    async def close(self) -> None:
        for task in list(self._asking):
            task.cancel()
        await asyncio.gather(*self._asking, return_exceptions=True)


def too_large(rows: int, size: int | None, limit: int) -> InvalidArgument:
    """A request's refusal: its `rows` make a message of `size` bytes (None: not known)."""
    made = "a message" if size is None else f"a message of about {size} bytes"
    return InvalidArgument(
        f"a request of {rows} rows makes {made} between the layers, beyond their limit of "
        f"{limit} bytes (server.max_message_bytes): send fewer rows per request"
    )


def is_too_large(exc: BaseException) -> bool:
    """Whether a hop failed because a message passed gRPC's size limit."""
    return (
        isinstance(exc, StrataError)
        and exc.code.name == "RESOURCE_EXHAUSTED"
        and TOO_LARGE in str(exc).lower()
    )


def arm_of(request: ClientRequest) -> Arm:
    """The arm of a request that has its route."""
    deployment = request.route.deployment if request.route else ""
    return Arm(request.pipeline_name, deployment, request.pipeline.model.name, request.version)
