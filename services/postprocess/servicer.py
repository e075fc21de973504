"""strata.v1.Postprocess: decode, run each request's (or flight's) rules, encode.

The requests of one call run concurrently, each failing or succeeding on its own; a flight's
chain runs once over its stacked rows (strata.calls.v1process has the flight mechanism).
"""

from __future__ import annotations

from services.postprocess.engine import RuleEngine
from strata.calls.streams import DEFAULT_MAX_IN_FLIGHT
from strata.calls.v1process import process_all_async
from strata.calls.v1stream import ProcessService
from strata.proto.v1 import postprocess_pb2_grpc, tensor_pb2


class PostprocessServicer(ProcessService, postprocess_pb2_grpc.PostprocessServicer):
    SERVICE = "strata.v1.Postprocess"

    def __init__(
        self, engine: RuleEngine, max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ) -> None:
        super().__init__(max_stream_in_flight)
        self._engine = engine

    async def _process(self, request: tensor_pb2.ProcessRequest) -> tensor_pb2.ProcessResponse:
        return await process_all_async(request, self._engine.run)
