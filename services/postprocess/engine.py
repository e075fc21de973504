"""The rule engine: each request's rule chain on a bounded thread pool, under time limits.

A request's rules run one after another on one worker thread, so a request costs a single
hand-off to the pool, and requests never wait for each other's rules. A chain of bounded
rules (rules/base.py) over at most `inline_max_bytes` runs on the event loop instead: it
cannot block, and the hand-off would cost more than the rules. A flight (several
client requests stacked, see strata.calls.v1process) is one request here: its chain runs once, each
rule once over all its rows, and a rule's time limit applies to that one run. The event loop sleeps
until the running rule's limit; a rule still running then is abandoned: it is skipped,
counted, logged with the trace id, and the chain continues on a fresh worker from the next
rule. A protecting rule (redaction) is never skipped so: when one did not run, the request
is refused UNAVAILABLE (the answer is withheld, not blamed on the client) instead of being
answered without it. The abandoned thread finishes in its own time (a regex stops at its
timeout) and its result is dropped. `workers` chains run at once; `spare_threads` more
threads absorb abandoned rules so that they do not take the pool from other requests.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor

from opentelemetry import trace

from services.postprocess.metrics import RuleMetrics
from services.postprocess.rule_chain import Pass, RuleChain
from services.postprocess.rules import RuleContext
from strata.config.postprocess import PostprocessSettings
from strata.errors import InvalidArgument, NotFound, Unavailable, shown
from strata.telemetry.tracing import annotate
from strata.wire.codec import Arrays

log = logging.getLogger(__name__)

CORE_ONLY = "core_only"


def core_only(parameters: Mapping[str, str]) -> bool:
    """The request's `core_only` switch: "true" or "false" (any case), absent is false."""
    value = parameters.get(CORE_ONLY, "false").lower()
    if value not in ("true", "false"):
        raise InvalidArgument(
            f"parameter {CORE_ONLY!r} must be 'true' or 'false', got {shown(value)}"
        )
    return value == "true"


def trace_id() -> str:
    """The current span's trace id as 32 hex digits (zeros outside a trace)."""
    return format(trace.get_current_span().get_span_context().trace_id, "032x")


class RuleEngine:
    """Every pipeline's chain, and the threads their rules run on."""

    def __init__(
        self,
        chains: dict[str, RuleChain],
        settings: PostprocessSettings,
        metrics: RuleMetrics | None = None,
    ) -> None:
        self._chains = chains
        self._settings = settings
        self.metrics = metrics or RuleMetrics()
        self._pool = ThreadPoolExecutor(
            max_workers=settings.workers + settings.spare_threads, thread_name_prefix="rules"
        )
        self._slots = asyncio.Semaphore(settings.workers)
        self._stuck_lock = threading.Lock()
        self._stuck = 0

    def get(self, name: str) -> RuleChain:
        try:
            return self._chains[name]
        except KeyError:
            raise NotFound(f"unknown pipeline {name!r}") from None

    async def run(
        self, pipeline: str, tensors: Arrays, parameters: Mapping[str, str]
    ) -> tuple[Arrays, dict[str, str]]:
        """One request (or flight) through its pipeline's rules: outputs, and caller info."""
        chain = self.get(pipeline)
        state = Pass(chain, tensors, parameters, core_only(parameters))
        if chain.rules and self._inline(chain, tensors):
            self._work(state, state.generation)
        elif chain.rules:
            while not await self._advance(state):
                pass
        self._report(state)
        _refuse_unprotected(state)
        return state.outputs(), state.info()

    def _inline(self, chain: RuleChain, tensors: Arrays) -> bool:
        """Whether the chain runs here, on the event loop: bounded rules, a small input."""
        if not chain.bounded:
            return False
        return sum(array.nbytes for array in tensors.values()) <= self._settings.inline_max_bytes

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def _advance(self, state: Pass) -> bool:
        """Run rules on a worker until the chain ends (True) or one is abandoned (False)."""
        generation = state.generation
        async with self._slots:
            # The worker runs in this request's context, so rules can see its trace.
            context = contextvars.copy_context()
            work = self._pool.submit(context.run, self._work, state, generation)
            future = asyncio.wrap_future(work)
            try:
                while True:
                    done, _ = await asyncio.wait({future}, timeout=state.wait_seconds())
                    if done:
                        future.result()
                        return True
                    if state.abandon_if_overdue():
                        future.add_done_callback(_retrieve)
                        self._hold(work)
                        return False
            except asyncio.CancelledError:
                state.abandon()
                future.add_done_callback(_retrieve)
                raise

    def _work(self, state: Pass, generation: int) -> None:
        """On a worker thread: claim and run rules until done or abandoned."""
        while (claimed := state.claim(generation)) is not None:
            index, entry, tensors, deadline = claimed
            started = time.perf_counter()
            try:
                result = entry.rule.apply(tensors, RuleContext(deadline))
            except TimeoutError:
                result = None  # the rule stopped itself at its limit (a regex timeout)
            finally:
                seconds = time.perf_counter() - started
                self.metrics.record(state.chain.name, entry.name, seconds)
                state.timed.append(f"{entry.name} {seconds * 1000:.3f} ms")
            state.finish(generation, index, result)

    def _hold(self, work: Future[None]) -> None:
        """Count the thread an abandoned rule holds, until it returns (on that thread)."""
        with self._stuck_lock:
            self._stuck += 1
            self.metrics.stuck_threads = stuck = self._stuck
        if stuck > self._settings.spare_threads:
            log.warning(
                "%d abandoned rules still hold threads, more than spare_threads=%d; "
                "rule chains may queue until they end",
                stuck,
                self._settings.spare_threads,
            )
        work.add_done_callback(self._released)

    def _released(self, work: Future[None]) -> None:
        with self._stuck_lock:
            self._stuck -= 1
            self.metrics.stuck_threads = self._stuck

    def _report(self, state: Pass) -> None:
        """The rules' times on the request's span (a span per rule would cost more than most
        rules); an overrun also in the metrics and the log."""
        annotate(rules=list(state.timed))
        if not state.overran:
            return
        for name in state.overran:
            self.metrics.overrun(state.chain.name, name)
        annotate(skipped_rules=",".join(state.skipped))
        limits = ", ".join(f"{name} ({state.timeout_of(name):g}s)" for name in state.overran)
        log.warning(
            "pipeline %s: rules overran their time limits: %s; skipped_rules=%s trace_id=%s",
            state.chain.name,
            limits,
            ",".join(state.skipped),
            trace_id(),
        )


def _refuse_unprotected(state: Pass) -> None:
    """UNAVAILABLE, naming them, if a protecting rule that was to run did not: its output
    would go out unprotected (unredacted text), so none goes out."""
    unprotected = state.unprotected()
    if not unprotected:
        return
    limits = ", ".join(f"{name!r} ({state.timeout_of(name):g}s)" for name in unprotected)
    raise Unavailable(
        f"pipeline {state.chain.name!r}: the answer is withheld because protecting rules did "
        f"not finish within their time limits: {limits}"
    )


def _retrieve(future: asyncio.Future[None]) -> None:
    """Consume an abandoned worker's outcome so asyncio does not report it as lost."""
    if not future.cancelled():
        future.exception()
