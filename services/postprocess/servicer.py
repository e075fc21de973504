"""strata.v1.Postprocess: decode, run each request's (or flight's) rules, encode.

The requests of one call run concurrently, each failing or succeeding on its own; a flight's
chain runs once over its stacked rows (strata.process has the flight mechanism).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.postprocess.engine import RuleEngine
from strata.grpc_errors import grpc_errors
from strata.process import process_all_async
from strata.proto.v1 import postprocess_pb2_grpc, tensor_pb2
from strata.streams import DEFAULT_MAX_IN_FLIGHT
from strata.v1stream import serve_stream


class PostprocessServicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(
        self, engine: RuleEngine, max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ) -> None:
        self._engine = engine
        self._max_stream_in_flight = max_stream_in_flight

    @grpc_errors
    async def Process(
        self, request: tensor_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> tensor_pb2.ProcessResponse:
        return await self._process(request)

    async def ProcessStream(
        self,
        requests: AsyncIterator[tensor_pb2.ProcessRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[tensor_pb2.ProcessResponse]:
        method = "/strata.v1.Postprocess/ProcessStream"
        limit = self._max_stream_in_flight
        async for answer in serve_stream(requests, self._process, method, limit):
            yield answer

    async def _process(self, request: tensor_pb2.ProcessRequest) -> tensor_pb2.ProcessResponse:
        return await process_all_async(request, self._engine.run)
