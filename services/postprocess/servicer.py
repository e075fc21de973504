"""strata.v1.Postprocess: decode, run each request's (or flight's) rules, encode.

The requests of one call run concurrently, each failing or succeeding on its own; a flight's
chain runs once over its stacked rows (strata.process has the flight mechanism).
"""

from __future__ import annotations

import grpc

from services.postprocess.engine import RuleEngine
from strata.grpc_errors import grpc_errors
from strata.process import process_all_async
from strata.proto.v1 import postprocess_pb2_grpc, tensor_pb2


class PostprocessServicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine

    @grpc_errors
    async def Process(
        self, request: tensor_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> tensor_pb2.ProcessResponse:
        return await process_all_async(request, self._engine.run)
