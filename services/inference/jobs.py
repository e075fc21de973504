"""Queued requests of one model version, by priority level and then arrival.

Rows are counted as requests come and go (a request of 5 rows counts 5). Requests leave the
queue lazily: one taken into a batch, cancelled by its caller or past its deadline is marked
and skipped, and falls out when it reaches the front, so taking a batch from the middle of
the queue costs no search.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum

from opentelemetry.trace import Span, SpanContext

from services.inference.statistics import DEADLINE, VersionStats
from strata.wire.codec import Arrays
from strata.wire.deadline import Deadline, earliest

# How many queued entries forming one batch looks at, per row of the max batch size: keeps it
# cheap when many requests that cannot share the batch wait.
SCAN_PER_ROW = 4


class State(Enum):
    QUEUED = 1
    TAKEN = 2
    DEAD = 3


@dataclass(frozen=True)
class Request:
    """What the caller asks of one request besides its inputs."""

    priority: int = 0  # 0: the model's default level
    deadline: Deadline | None = None
    skip_batching: bool = False


@dataclass(eq=False)
class Job:
    """One queued request."""

    inputs: Arrays
    rows: int
    key: Hashable  # requests share a batch only with equal keys
    level: int
    deadline: Deadline | None
    alone: bool  # runs in a batch of its own
    enqueued: float  # time.monotonic()
    future: asyncio.Future[Arrays]
    length: int = 0  # cells per row of its padded inputs; 0 when the model pads nothing
    link: SpanContext | None = None  # the request's span, for its batch's span to link to
    caller: Span | None = None  # the recording span of the call that queued it, if any
    state: State = field(default=State.QUEUED)
    queued: float = 0.0  # seconds it waited, once its batch has started
    batch: Span | None = None
    batch_rows: int = 0


class Padding:
    """The cells of a forming batch: each row is padded to the longest request's length."""

    def __init__(self, max_share: float) -> None:
        self._max_share = max_share
        self._rows = self._cells = self._longest = 0

    def fits(self, job: Job) -> bool:
        """Whether `job` can join without padding filling more than the allowed share."""
        rows, cells = self._rows + job.rows, self._cells + job.rows * job.length
        padded = rows * max(self._longest, job.length)
        return padded - cells <= self._max_share * padded

    def add(self, job: Job) -> None:
        self._rows += job.rows
        self._cells += job.rows * job.length
        self._longest = max(self._longest, job.length)


# Returns the error to answer a job with when it can no longer finish in time, else None.
Lateness = Callable[[Job], Exception | None]


class JobQueue:
    """Priority levels 1 (first) to N, each first in, first out."""

    def __init__(
        self, levels: int, max_rows: int, stats: VersionStats, max_padding: float = 1.0
    ) -> None:
        self._levels: list[deque[Job]] = [deque() for _ in range(levels)]
        self._rows_by_level = [0] * levels
        self._alone = 0
        self._max_rows = max_rows
        self._max_padding = max_padding
        self._stats = stats  # its queued_rows and queued_requests are this queue's gauges

    @property
    def rows(self) -> int:
        return self._stats.queued_rows

    @property
    def requests(self) -> int:
        return self._stats.queued_requests

    def rows_ahead(self, level: int) -> int:
        """Rows queued at `level` or before it."""
        return sum(self._rows_by_level[:level])

    def push(self, job: Job) -> None:
        self._levels[job.level - 1].append(job)
        self._count(job, +1)

    def take(self, jobs: list[Job]) -> list[Job]:
        for job in jobs:
            self._leave(job, State.TAKEN)
        return jobs

    def drop(self, job: Job, reason: str, error: Exception | None = None) -> None:
        """Remove a queued job without running it, answering it with `error` if given."""
        self._leave(job, State.DEAD)
        self._stats.reject(reason)
        if error is not None and not job.future.done():
            job.future.set_exception(error)

    def head(self, late: Lateness) -> Job | None:
        """The first live job, dropping late ones on the way."""
        for queue in self._levels:
            while queue:
                job = queue[0]
                if job.state is State.QUEUED and not self._dropped_late(job, late):
                    return job
                queue.popleft()
        return None

    def collect(self, head: Job, late: Lateness) -> tuple[list[Job], int, Deadline | None]:
        """`head` and the later jobs that can share its batch while the rows fit and padding
        stays within its share: the jobs, their rows, and the earliest of their deadlines."""
        group: list[Job] = []
        rows, deadline = 0, None
        padding = Padding(self._max_padding)
        budget = SCAN_PER_ROW * self._max_rows
        for queue in self._levels:
            for job in queue:
                budget -= 1
                if budget < 0:
                    return group, rows, deadline
                if job.state is not State.QUEUED or job.alone or job.key != head.key:
                    continue
                if self._dropped_late(job, late):
                    continue
                if rows + job.rows > self._max_rows:
                    return group, rows, deadline
                if group and not padding.fits(job):
                    continue
                padding.add(job)
                group.append(job)
                rows += job.rows
                deadline = earliest(deadline, job.deadline)
        return group, rows, deadline

    def first_alone(self) -> Job | None:
        """The first job that asked to skip batching, if any waits."""
        if not self._alone:
            return None
        for queue in self._levels:
            for job in queue:
                if job.state is State.QUEUED and job.alone:
                    return job
        return None

    def _dropped_late(self, job: Job, late: Lateness) -> bool:
        error = late(job)
        if error is not None:
            self.drop(job, DEADLINE, error)
        return error is not None

    def _leave(self, job: Job, state: State) -> None:
        job.state = state
        self._count(job, -1)

    def _count(self, job: Job, sign: int) -> None:
        self._rows_by_level[job.level - 1] += sign * job.rows
        self._alone += sign * job.alone
        self._stats.queued_rows += sign * job.rows
        self._stats.queued_requests += sign
