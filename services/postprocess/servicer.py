"""strata.v1.Postprocess: decode, run each request's rules, encode."""

from __future__ import annotations

from collections.abc import Mapping

import grpc

from services.postprocess.engine import RuleEngine
from strata.errors import grpc_errors
from strata.process import Arrays, process_all
from strata.proto.v1 import postprocess_pb2_grpc, tensor_pb2


class PostprocessServicer(postprocess_pb2_grpc.PostprocessServicer):
    def __init__(self, engine: RuleEngine) -> None:
        self._engine = engine

    @grpc_errors
    async def Process(
        self, request: tensor_pb2.ProcessRequest, context: grpc.aio.ServicerContext
    ) -> tensor_pb2.ProcessResponse:
        return process_all(request, self._run)

    def _run(
        self, pipeline: str, tensors: Arrays, parameters: Mapping[str, str]
    ) -> tuple[Arrays, dict[str, str]]:
        return self._engine.get(pipeline).run(tensors), {}
