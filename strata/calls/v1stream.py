"""ProcessStream as preprocess and postprocess serve it: the gateway's hops as messages.

Each message is handled as a `Process` call of its own would be, in a server span of the
trace its `trace_context` names (what a unary call carries in its metadata), and answered
with its tag when ready; one that fails as a whole carries the status its call would have
ended with. Each message counts as a call of `method` in the RPC metrics.
strata.calls.streams bounds what one stream can make the server hold.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from strata.calls.grpc_errors import grpc_errors
from strata.calls.streams import answer_each
from strata.calls.v1process import error
from strata.errors import status_of
from strata.proto.v1 import tensor_pb2 as v1
from strata.telemetry.tracing import Meter, server_span

Handle = Callable[[v1.ProcessRequest], Awaitable[v1.ProcessResponse]]


async def serve_stream(
    requests: AsyncIterator[v1.ProcessRequest], handle: Handle, method: str, max_in_flight: int
) -> AsyncIterator[v1.ProcessResponse]:
    """Answer every message of the stream; `method` names the server spans."""

    meter = Meter(method)

    async def answer(request: v1.ProcessRequest) -> list[v1.ProcessResponse]:
        started = time.perf_counter()
        with server_span(method, request.trace_context):
            try:
                response = await handle(request)
            except Exception as exc:  # the message's failure, not the stream's
                code, message = status_of(exc)
                meter.record(code, time.perf_counter() - started)
                return [v1.ProcessResponse(tag=request.tag, error=error((code, message)))]
        meter.record(grpc.StatusCode.OK, time.perf_counter() - started)
        response.tag = request.tag
        return [response]

    def refuse(request: v1.ProcessRequest, detail: str) -> v1.ProcessResponse:
        failure = error((grpc.StatusCode.UNAVAILABLE, detail))
        return v1.ProcessResponse(tag=request.tag, error=failure)

    async for item in answer_each(requests, answer, refuse, max_in_flight):
        yield item


class ProcessService:
    """`Process` and `ProcessStream` over one `_process(request)`: what a layer's servicer
    (preprocess, postprocess) inherits beside its generated base, naming its `SERVICE`."""

    SERVICE = ""  # the full service name, e.g. "strata.v1.Preprocess"

    def __init__(self, max_stream_in_flight: int) -> None:
        self._max_stream_in_flight = max_stream_in_flight

    @grpc_errors
    async def Process(
        self,
        request: v1.ProcessRequest,
        context: grpc.aio.ServicerContext[v1.ProcessRequest, v1.ProcessResponse],
    ) -> v1.ProcessResponse:
        return await self._process(request)

    async def ProcessStream(
        self,
        requests: AsyncIterator[v1.ProcessRequest],
        context: grpc.aio.ServicerContext[v1.ProcessRequest, v1.ProcessResponse],
    ) -> AsyncIterator[v1.ProcessResponse]:
        method = f"/{self.SERVICE}/ProcessStream"
        limit = self._max_stream_in_flight
        async for answer in serve_stream(requests, self._process, method, limit):
            yield answer

    async def _process(self, request: v1.ProcessRequest) -> v1.ProcessResponse:
        raise NotImplementedError
