"""Concurrent client requests through a strata.v1 hop in shared calls.

A Python gRPC call costs about as much CPU as a small model's whole inference, so under load
the gateway carries many requests in one `Process` call. A request goes at once, in a call of
its own, while fewer than `max_calls` calls to the hop are in flight: light load adds no wait.
Beyond that it waits for a call to finish and goes in the next one with every request that
queued meanwhile (at most `max_requests`). Each request keeps its own deadline and its own
result: one that fails, or whose caller gives up, leaves the others in the call alone.

Traces: a call of one request is part of that request's trace, like any call. A shared call
is a trace of its own, linked to the span each request has for its wait; that span's context
travels in the request's `trace_context`, so the layer's work for it joins its own trace.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import propagate, trace
from opentelemetry.trace import Link, Span

from services.gateway.metrics import CALL_REQUESTS
from strata.errors import DeadlineExceeded
from strata.policies import Coalesce
from strata.proto.v1 import tensor_pb2 as v1

if TYPE_CHECKING:
    from services.gateway.upstreams import Hop

TRACER = trace.get_tracer("strata.gateway")


@dataclass
class _Waiting:
    item: v1.Request
    deadline: float  # event-loop time
    future: asyncio.Future[v1.Result]
    span: Span


class Coalescer:
    """Shared calls to one preprocess or postprocess hop."""

    def __init__(self, hop: Hop, settings: Coalesce) -> None:
        self.hop = hop
        self.settings = settings
        self._queue: deque[_Waiting] = deque()
        self._in_flight = 0
        self._tasks: set[asyncio.Task] = set()

    async def process(self, item: v1.Request, budget: float) -> v1.Result:
        """The hop's result for `item`, within `budget` seconds."""
        if self._in_flight < self.settings.max_calls and not self._queue:
            return await self._alone(item, budget)
        loop = asyncio.get_running_loop()
        with TRACER.start_as_current_span(f"{self.hop.name} in a shared call") as span:
            propagate.inject(item.trace_context)
            waiting = _Waiting(item, loop.time() + budget, loop.create_future(), span)
            self._queue.append(waiting)
            self._pump()
            try:
                return await asyncio.wait_for(waiting.future, budget)
            except TimeoutError:
                raise DeadlineExceeded(f"deadline passed waiting for {self.hop.name}") from None

    async def _alone(self, item: v1.Request, budget: float) -> v1.Result:
        self._in_flight += 1
        try:
            return (await self._call([item], budget))[0]
        finally:
            self._in_flight -= 1
            self._pump()

    async def _call(self, items: list[v1.Request], budget: float) -> list[v1.Result]:
        CALL_REQUESTS.labels(self.hop.name).observe(len(items))
        request = v1.ProcessRequest(requests=items)
        reply = await self.hop.call("Process", request, budget)
        if len(reply.results) != len(items):
            raise RuntimeError(
                f"{self.hop.name} answered {len(reply.results)} results for {len(items)} requests"
            )
        return list(reply.results)

    def _pump(self) -> None:
        """Start shared calls for the queued requests while the in-flight bound allows."""
        while self._queue and self._in_flight < self.settings.max_calls:
            group = self._take()
            if not group:
                return
            self._in_flight += 1
            # A fresh context: the shared call belongs to none of the traces it carries.
            task = asyncio.create_task(self._shared(group), context=contextvars.Context())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Waiting]:
        """Up to `max_requests` queued requests whose callers still wait, oldest first."""
        group: list[_Waiting] = []
        while self._queue and len(group) < self.settings.max_requests:
            waiting = self._queue.popleft()
            if not waiting.future.done():
                group.append(waiting)
        return group

    async def _shared(self, group: list[_Waiting]) -> None:
        links = [Link(w.span.get_span_context()) for w in group]
        attributes = {"strata.hop": self.hop.name, "strata.requests": len(group)}
        try:
            with TRACER.start_as_current_span(
                f"{self.hop.name} call", links=links, attributes=attributes
            ):
                budget = max(w.deadline for w in group) - asyncio.get_running_loop().time()
                if budget <= 0:
                    raise DeadlineExceeded(f"deadline passed before {self.hop.name}")
                results = await self._call([w.item for w in group], budget)
        except Exception as exc:
            for waiting in group:
                if not waiting.future.done():
                    waiting.future.set_exception(exc)
        else:
            for waiting, result in zip(group, results, strict=True):
                if not waiting.future.done():
                    waiting.future.set_result(result)
        finally:
            self._in_flight -= 1
            self._pump()
