"""inference.GRPCInferenceService at the gateway: pipelines are the models clients see."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.gateway.caller import grpc_caller
from services.gateway.pipelines import Pipelines
from strata.grpc_errors import grpc_errors
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.streams import DEFAULT_MAX_IN_FLIGHT
from strata.v2stream import answer_stream


class GatewayServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self, pipelines: Pipelines, max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    ) -> None:
        self._pipelines = pipelines
        self._max_stream_in_flight = max_stream_in_flight

    def _client(self, context: grpc.aio.ServicerContext) -> str:
        return self._pipelines.identify(grpc_caller(context))

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=await self._pipelines.server_ready())

    async def ServerMetadata(self, request, context) -> v2.ServerMetadataResponse:
        return self._pipelines.server_metadata()

    @grpc_errors
    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        self._client(context)
        ready = await self._pipelines.model_ready(request.name, request.version)
        return v2.ModelReadyResponse(ready=ready)

    @grpc_errors
    async def ModelMetadata(self, request, context) -> v2.ModelMetadataResponse:
        self._client(context)
        return self._pipelines.model_metadata(request.name, request.version)

    @grpc_errors
    async def ModelConfig(self, request, context) -> v2.ModelConfigResponse:
        self._client(context)
        return self._pipelines.model_config(request.name, request.version)

    @grpc_errors
    async def ModelStatistics(self, request, context) -> v2.ModelStatisticsResponse:
        self._client(context)
        return self._pipelines.model_statistics(request.name, request.version)

    @grpc_errors
    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        return await self._pipelines.infer(request, grpc_caller(context))

    async def ModelStreamInfer(
        self, requests: AsyncIterator[v2.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each request of the stream through the pipeline on its own (strata.v2stream)."""

        async def infer(request: v2.ModelInferRequest) -> v2.ModelInferResponse:
            return await self._pipelines.infer(request, grpc_caller(context))

        async for answer in answer_stream(requests, infer, self._max_stream_in_flight):
            yield answer
