"""strata.v1.Postprocess: decode, run each request's rules, encode.

The requests of one call run concurrently, each failing or succeeding on its own.
"""

from __future__ import annotations

import asyncio

import grpc

from services.postprocess.engine import RuleEngine
from strata.codec import arrays_to_tensors, tensors_to_arrays
from strata.errors import grpc_errors
from strata.process import failed, in_own_trace
from strata.proto.v1 import postprocess_pb2_grpc, tensor_pb2


class PostprocessServicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine

    @grpc_errors
    async def Process(
        self, request: tensor_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> tensor_pb2.ProcessResponse:
        results = await asyncio.gather(*(self._one(item) for item in request.requests))
        return tensor_pb2.ProcessResponse(results=results)

    async def _one(self, item: tensor_pb2.Request) -> tensor_pb2.Result:
        with in_own_trace(item):
            try:
                tensors = tensors_to_arrays(item.tensors)
                outputs, info = await self._engine.run(item.pipeline, tensors, item.parameters)
            except Exception as exc:  # each request answers for itself, bug or not
                return failed(item, exc)
        return tensor_pb2.Result(id=item.id, tensors=arrays_to_tensors(outputs), info=info)
