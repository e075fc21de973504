"""One queue per model version: requests gather into batches by rows and run on a worker pool.

A request of 5 rows counts 5, and no batch exceeds the model's max batch size. A batch takes
the first request in priority order (services/inference/jobs.py) and every later one that can
share a batch with it while the rows fit; the batching policy (batching_policy.py) says when
that batch starts. At most `max_concurrent_batches` of one version run at once, in the shared
worker pool; only a batch whose measured run time is below `inline_max_ms` runs on the event
loop, where it costs less than the hand-off to a worker would.

Requests are refused at once, without running, when the queue is full (RESOURCE_EXHAUSTED) or
when their deadline has passed or cannot be met given the rows queued ahead and the measured
batch time (DEADLINE_EXCEEDED). If a batch fails, its requests run again one by one, so only
the request that caused the failure gets an error.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import Executor

from opentelemetry.trace import Span, SpanContext

from services.inference import spans
from services.inference import statistics as reasons
from services.inference.batching_policy import ArrivalRate, ExecutionModel, Utilization, make_policy
from services.inference.jobs import Job, JobQueue, Request, State
from services.inference.statistics import VersionStats
from strata.config.inference import InferenceSettings
from strata.errors import DeadlineExceeded, Overloaded, Unavailable
from strata.wire.codec import Arrays
from strata.wire.deadline import Deadline

log = logging.getLogger(__name__)

# Runs a list of requests as one batch (blocking, in a worker thread); one answer each.
Runner = Callable[[Sequence[Arrays]], list[Arrays]]
Outcome = Arrays | BaseException


class Batcher:
    """The queue and batch scheduling of one model version."""

    def __init__(
        self,
        label: str,
        runner: Runner,
        executor: Executor,
        settings: InferenceSettings.Batching,
        max_rows: int,
        concurrency: int,
        stats: VersionStats,
    ) -> None:
        self.label = label
        self.execution = ExecutionModel()  # start to answers back on the loop
        self.compute = ExecutionModel()  # the run alone, to decide where a batch runs
        self._arrivals = ArrivalRate()
        self._busy = Utilization(concurrency)
        self._policy = make_policy(settings, max_rows, self.execution, self._arrivals, self._busy)
        self._runner = runner
        self._executor = executor
        self._settings = settings
        self._max_rows = max_rows
        self._concurrency = concurrency
        self._stats = stats
        self._queue = JobQueue(settings.priority_levels, max_rows, stats, settings.max_padding)
        self._running = 0
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._pump_soon = False
        self._drained = asyncio.Event()

    async def submit(
        self,
        inputs: Arrays,
        rows: int,
        key: Hashable,
        request: Request,
        length: int = 0,
        link: SpanContext | None = None,
    ) -> Arrays:
        """Queue one request (`length`: its padded cells per row) and wait for its answer;
        its batch's span links to `link` (a flight member's span), else to the caller's."""
        loop = asyncio.get_running_loop()
        now = time.monotonic()
        level = request.priority or self._settings.default_priority
        self._admit(rows, level, request.deadline, now)
        future: asyncio.Future[Arrays] = loop.create_future()
        job = Job(
            inputs, rows, key, level, request.deadline, request.skip_batching, now, future, length
        )
        job.link = link or spans.current()
        job.caller = spans.caller()
        self._queue.push(job)
        self._arrivals.observe(now, rows)
        self._schedule(loop)
        try:
            return await job.future
        except asyncio.CancelledError:
            if job.state is State.QUEUED:
                self._queue.drop(job, reasons.CANCELLED)
                self._check_drained()
            raise
        finally:
            spans.note_request(job.queued, job.batch_rows, job.batch)

    def close(self) -> None:
        """Take no new requests; those queued still run, without waiting for company."""
        self._closed = True
        self._pump()
        self._check_drained()

    async def drained(self) -> None:
        """Wait until every queued and running batch of a closed batcher has finished."""
        await self._drained.wait()

    def _drain_seconds(self) -> float:
        """About how long the queued rows take to run: when a retry may find room."""
        batches = self._queue.rows / self._max_rows / self._concurrency
        return max(0.001, batches * self.execution.estimate(self._max_rows))

    def _admit(self, rows: int, level: int, deadline: Deadline | None, now: float) -> None:
        if self._closed:
            self._stats.reject(reasons.RETIRED)
            raise Unavailable(f"{self.label} is being replaced; retry the request")
        if self._queue.rows + rows > self._settings.max_queue_rows:
            self._stats.reject(reasons.QUEUE_FULL)
            raise Overloaded(
                f"{self.label}: queue full ({self._queue.rows} rows queued, "
                f"limit {self._settings.max_queue_rows}); retry later",
                self._drain_seconds(),
            )
        if deadline is None:
            return
        if deadline.at <= now:
            self._stats.reject(reasons.DEADLINE)
            raise DeadlineExceeded(f"{self.label}: the deadline passed before the request queued")
        ahead = self._queue.rows_ahead(level)
        full = self.execution.estimate(self._max_rows)
        # Optimistic: batches ahead run `concurrency` at a time, and the running ones are done.
        rounds = (ahead // self._max_rows) // self._concurrency
        if now + rounds * full + self.execution.estimate(rows) > deadline.at:
            self._stats.reject(reasons.DEADLINE)
            raise DeadlineExceeded(
                f"{self.label}: cannot finish within the deadline ({(deadline.at - now) * 1e3:.1f} "
                f"ms left; {ahead} rows queued ahead, a full batch takes about "
                f"{full * 1e3:.1f} ms)"
            )

    def _late(self, job: Job) -> Exception | None:
        """DEADLINE_EXCEEDED for a queued job that could not finish even if it started now."""
        now = time.monotonic()
        if job.deadline is None or job.deadline.at >= now + self.execution.estimate(job.rows):
            return None
        return DeadlineExceeded(
            f"{self.label}: the deadline would pass before the request's batch could finish "
            f"(waited {(now - job.enqueued) * 1e3:.1f} ms in the queue)"
        )

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """Pump once the event loop has run what is ready now: requests that arrive together
        (in one loop iteration: a burst, or a backlog while the loop was busy) are batched
        together, at the cost of one loop iteration when they come alone."""
        if not self._pump_soon:
            self._pump_soon = True
            loop.call_soon(self._pump)

    def _pump(self) -> None:
        """Start every batch the policy and the free worker slots allow."""
        self._pump_soon = False
        loop = asyncio.get_running_loop()
        while self._running < self._concurrency:
            now = time.monotonic()
            jobs, at = self._form(now)
            if jobs is None:
                if at is not None:
                    self._set_timer(loop, at)
                break
            self._start(loop, jobs, now)
        self._check_drained()

    def _form(self, now: float) -> tuple[list[Job] | None, float | None]:
        """The batch to start now, or (None, when to look again)."""
        head = self._queue.head(self._late)
        if head is None:
            return None, None
        if head.alone or not self._policy.batches:
            return self._queue.take([head]), None
        group, rows, deadline = self._queue.collect(head, self._late)
        at = self._policy.start_at(now, head.enqueued, rows)
        if deadline is not None:
            at = min(at, deadline.at - self.execution.estimate(rows))
        if at <= now or self._closed:
            return self._queue.take(group), None
        alone = self._queue.first_alone()
        if alone is not None:
            return self._queue.take([alone]), None
        return None, at

    def _set_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        """Pump again at `at` (time.monotonic(), as every time here)."""
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = loop.call_later(at - time.monotonic(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._pump()

    def _start(self, loop: asyncio.AbstractEventLoop, jobs: list[Job], now: float) -> None:
        self._running += 1
        self._busy.change(now, self._running)
        rows = sum(job.rows for job in jobs)
        for job in jobs:
            job.queued = now - job.enqueued
            self._stats.record_queued(job.queued)
        links = [(job.link, job.queued) for job in jobs]
        caller = _one_caller(jobs)
        span = spans.start_batch(self._stats.name, self._stats.version, links, rows, caller)
        for job in jobs:
            job.batch, job.batch_rows = span, rows
        inputs = [job.inputs for job in jobs]
        finish = functools.partial(self._finish, loop, jobs, now, span, caller is None)
        if self._runs_inline(rows):
            done = loop.create_future()
            done.set_result(self._work(inputs))
            loop.call_soon(finish, done)
            return
        try:
            work = loop.run_in_executor(self._executor, self._work, inputs)
        except RuntimeError as exc:  # the pool is shut down: the service is stopping
            self._running -= 1
            self._busy.change(now, self._running)
            error = Unavailable(f"{self.label} is shutting down ({exc})")
            self._answer(jobs, [error] * len(jobs), 0.0, now)
            spans.end_batch(span, 0.0, len(jobs), own=caller is None)
            return
        work.add_done_callback(finish)

    def _runs_inline(self, rows: int) -> bool:
        """Whether a batch of `rows` is so short that a thread hand-off would cost more."""
        limit = self._settings.inline_max_ms / 1000
        return limit > 0 and self.compute.known and self.compute.estimate(rows) <= limit

    def _finish(
        self,
        loop: asyncio.AbstractEventLoop,
        jobs: list[Job],
        started: float,
        span: Span,
        own_span: bool,
        work: asyncio.Future[tuple[Sequence[Outcome], float, bool]],
    ) -> None:
        """Back on the event loop: answer the batch's requests and start the next batch."""
        self._running -= 1
        now = time.monotonic()
        self._busy.change(now, self._running)
        try:
            outcomes, compute, whole = work.result()
        except (Exception, asyncio.CancelledError) as exc:  # the pool dropped the work
            error = Unavailable(f"{self.label} could not run the batch ({exc!r})")
            outcomes, compute, whole = [error] * len(jobs), 0.0, False
        rows = sum(job.rows for job in jobs)
        if whole:
            # The time a batch takes as the queue sees it: from its start until its answers
            # are back on the loop, hand-offs and a busy loop included, not only the run.
            self.execution.observe(rows, now - started)
            self.compute.observe(rows, compute)
        self._stats.record_batch(rows, compute)
        self._answer(jobs, outcomes, compute, now)
        failures = sum(isinstance(o, BaseException) for o in outcomes)
        spans.end_batch(span, compute, failures, own_span)
        self._pump()

    def _answer(
        self, jobs: list[Job], outcomes: Sequence[Outcome], compute: float, now: float
    ) -> None:
        for job, outcome in zip(jobs, outcomes, strict=True):
            failed = isinstance(outcome, BaseException)
            self._stats.record_answer(job.rows, now - job.enqueued, compute, not failed)
            if job.future.done():
                continue
            if isinstance(outcome, BaseException):
                job.future.set_exception(outcome)
            else:
                job.future.set_result(outcome)

    def _work(self, inputs: list[Arrays]) -> tuple[Sequence[Outcome], float, bool]:
        """Run one batch in a worker thread; if it fails, each request alone."""
        start = time.perf_counter()
        try:
            return self._runner(inputs), time.perf_counter() - start, True
        except Exception as exc:
            if len(inputs) == 1:
                return [exc], time.perf_counter() - start, False
            log.warning(
                "%s: a batch of %d requests failed (%s); running each alone",
                self.label,
                len(inputs),
                exc,
            )
        outcomes: list[Outcome] = []
        for one in inputs:
            try:
                outcomes.extend(self._runner([one]))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes, time.perf_counter() - start, False

    def _check_drained(self) -> None:
        if self._closed and not self._queue.requests and not self._running:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._drained.set()


def _one_caller(jobs: list[Job]) -> Span | None:
    """The span of the one call every job of a batch came from; None if they came from
    several, or from a call no span records."""
    first = jobs[0].caller
    return first if all(job.caller is first for job in jobs) else None
