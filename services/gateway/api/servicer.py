"""inference.GRPCInferenceService at the gateway: pipelines are the models clients see."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from grpc.aio import ServicerContext as Context

from services.gateway.api.repository import Repository
from services.gateway.api.server_settings import LogValue, ServerSettings
from services.gateway.door.caller import grpc_caller
from services.gateway.serving.pipelines import Pipelines
from services.gateway.serving.shared_memory import CUDA_HINT, no_cuda_regions
from strata.calls.grpc_errors import answers_unimplemented, grpc_errors
from strata.calls.streams import DEFAULT_MAX_IN_FLIGHT
from strata.calls.v2stream import answer_stream
from strata.errors import StrataError, status_of
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.security.occupancy import Shares, refuse

LOG_FIELDS = {bool: "bool_param", int: "uint32_param", str: "string_param"}
SERVER = "Strata's gateway"
StreamContext = Context[v2.ModelInferRequest, v2.ModelStreamInferResponse]


@answers_unimplemented(
    v2_grpc.GRPCInferenceServiceServicer, SERVER, {"CudaSharedMemory": CUDA_HINT}
)
class GatewayServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(
        self,
        pipelines: Pipelines,
        repository: Repository,
        settings: ServerSettings,
        max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        max_streams_per_client: int | None = None,
    ) -> None:
        self._pipelines = pipelines
        self._repository = repository
        self._settings = settings
        self._max_stream_in_flight = max_stream_in_flight
        self._streams = Shares(max_streams_per_client)

    def _client(self, context: Context[Any, Any]) -> str:
        return self._pipelines.identify(grpc_caller(context))

    async def ServerLive(
        self,
        request: v2.ServerLiveRequest,
        context: Context[v2.ServerLiveRequest, v2.ServerLiveResponse],
    ) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(
        self,
        request: v2.ServerReadyRequest,
        context: Context[v2.ServerReadyRequest, v2.ServerReadyResponse],
    ) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=await self._pipelines.server_ready())

    async def ServerMetadata(
        self,
        request: v2.ServerMetadataRequest,
        context: Context[v2.ServerMetadataRequest, v2.ServerMetadataResponse],
    ) -> v2.ServerMetadataResponse:
        return self._pipelines.server_metadata()

    @grpc_errors
    async def ModelReady(
        self,
        request: v2.ModelReadyRequest,
        context: Context[v2.ModelReadyRequest, v2.ModelReadyResponse],
    ) -> v2.ModelReadyResponse:
        self._client(context)
        ready = await self._pipelines.model_ready(request.name, request.version)
        return v2.ModelReadyResponse(ready=ready)

    @grpc_errors
    async def ModelMetadata(
        self,
        request: v2.ModelMetadataRequest,
        context: Context[v2.ModelMetadataRequest, v2.ModelMetadataResponse],
    ) -> v2.ModelMetadataResponse:
        self._client(context)
        return self._pipelines.model_metadata(request.name, request.version)

    @grpc_errors
    async def ModelConfig(
        self,
        request: v2.ModelConfigRequest,
        context: Context[v2.ModelConfigRequest, v2.ModelConfigResponse],
    ) -> v2.ModelConfigResponse:
        self._client(context)
        return self._pipelines.model_config(request.name, request.version)

    @grpc_errors
    async def ModelStatistics(
        self,
        request: v2.ModelStatisticsRequest,
        context: Context[v2.ModelStatisticsRequest, v2.ModelStatisticsResponse],
    ) -> v2.ModelStatisticsResponse:
        self._client(context)
        return self._pipelines.model_statistics(request.name, request.version)

    @grpc_errors
    async def RepositoryIndex(
        self,
        request: v2.RepositoryIndexRequest,
        context: Context[v2.RepositoryIndexRequest, v2.RepositoryIndexResponse],
    ) -> v2.RepositoryIndexResponse:
        return await self._repository.index(grpc_caller(context), request.ready)

    @grpc_errors
    async def RepositoryModelLoad(
        self,
        request: v2.RepositoryModelLoadRequest,
        context: Context[v2.RepositoryModelLoadRequest, v2.RepositoryModelLoadResponse],
    ) -> v2.RepositoryModelLoadResponse:
        await self._repository.load(grpc_caller(context), request.model_name, request.parameters)
        return v2.RepositoryModelLoadResponse()

    @grpc_errors
    async def RepositoryModelUnload(
        self,
        request: v2.RepositoryModelUnloadRequest,
        context: Context[v2.RepositoryModelUnloadRequest, v2.RepositoryModelUnloadResponse],
    ) -> v2.RepositoryModelUnloadResponse:
        await self._repository.unload(grpc_caller(context), request.model_name)
        return v2.RepositoryModelUnloadResponse()

    @grpc_errors
    async def SystemSharedMemoryStatus(
        self,
        request: v2.SystemSharedMemoryStatusRequest,
        context: Context[v2.SystemSharedMemoryStatusRequest, v2.SystemSharedMemoryStatusResponse],
    ) -> v2.SystemSharedMemoryStatusResponse:
        regions = self._pipelines.memory.status(self._client(context), request.name)
        status = v2.SystemSharedMemoryStatusResponse.RegionStatus
        return v2.SystemSharedMemoryStatusResponse(
            regions={
                r.name: status(name=r.name, key=r.key, offset=r.offset, byte_size=r.byte_size)
                for r in regions
            }
        )

    @grpc_errors
    async def SystemSharedMemoryRegister(
        self,
        request: v2.SystemSharedMemoryRegisterRequest,
        context: Context[
            v2.SystemSharedMemoryRegisterRequest, v2.SystemSharedMemoryRegisterResponse
        ],
    ) -> v2.SystemSharedMemoryRegisterResponse:
        client = self._client(context)
        memory = self._pipelines.memory
        memory.register(client, request.name, request.key, request.offset, request.byte_size)
        return v2.SystemSharedMemoryRegisterResponse()

    @grpc_errors
    async def SystemSharedMemoryUnregister(
        self,
        request: v2.SystemSharedMemoryUnregisterRequest,
        context: Context[
            v2.SystemSharedMemoryUnregisterRequest, v2.SystemSharedMemoryUnregisterResponse
        ],
    ) -> v2.SystemSharedMemoryUnregisterResponse:
        self._pipelines.memory.unregister(self._client(context), request.name)
        return v2.SystemSharedMemoryUnregisterResponse()

    @grpc_errors
    async def CudaSharedMemoryStatus(
        self,
        request: v2.CudaSharedMemoryStatusRequest,
        context: Context[v2.CudaSharedMemoryStatusRequest, v2.CudaSharedMemoryStatusResponse],
    ) -> v2.CudaSharedMemoryStatusResponse:
        self._client(context)
        no_cuda_regions(
            request.name, f"CudaSharedMemoryStatus of one region is not implemented by {SERVER}"
        )
        return v2.CudaSharedMemoryStatusResponse()

    @grpc_errors
    async def CudaSharedMemoryUnregister(
        self,
        request: v2.CudaSharedMemoryUnregisterRequest,
        context: Context[
            v2.CudaSharedMemoryUnregisterRequest, v2.CudaSharedMemoryUnregisterResponse
        ],
    ) -> v2.CudaSharedMemoryUnregisterResponse:
        self._client(context)
        no_cuda_regions(
            request.name, f"CudaSharedMemoryUnregister of one region is not implemented by {SERVER}"
        )
        return v2.CudaSharedMemoryUnregisterResponse()

    @grpc_errors
    async def LogSettings(
        self,
        request: v2.LogSettingsRequest,
        context: Context[v2.LogSettingsRequest, v2.LogSettingsResponse],
    ) -> v2.LogSettingsResponse:
        self._client(context)
        changes: dict[str, LogValue] = {
            key: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for key, value in request.settings.items()
        }
        settings = self._settings.set_log(grpc_caller(context), changes)
        response = v2.LogSettingsResponse()
        for key, value in settings.items():
            setattr(response.settings[key], LOG_FIELDS[type(value)], value)
        return response

    @grpc_errors
    async def TraceSetting(
        self,
        request: v2.TraceSettingRequest,
        context: Context[v2.TraceSettingRequest, v2.TraceSettingResponse],
    ) -> v2.TraceSettingResponse:
        self._client(context)
        changes = {key: list(value.value) for key, value in request.settings.items()}
        settings = self._settings.set_trace(grpc_caller(context), request.model_name, changes)
        response = v2.TraceSettingResponse()
        for key, values in settings.items():
            response.settings[key].value.extend(values)
        return response

    @grpc_errors
    async def ModelInfer(
        self,
        request: v2.ModelInferRequest,
        context: Context[v2.ModelInferRequest, v2.ModelInferResponse],
    ) -> v2.ModelInferResponse:
        return await self._pipelines.infer(request, grpc_caller(context))

    async def ModelStreamInfer(
        self,
        requests: AsyncIterator[v2.ModelInferRequest],
        context: StreamContext,
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each request of the stream through the pipeline on its own (strata.calls.v2stream), once
        the stream's caller is known and within its share of streams: its response, or a
        decoupled pipeline's zero or more."""

        async def infer(request: v2.ModelInferRequest) -> list[v2.ModelInferResponse]:
            return await self._pipelines.stream_answer(request, grpc_caller(context))

        async with self._stream_held(context):
            async for answer in answer_stream(requests, infer, self._max_stream_in_flight):
                yield answer

    @asynccontextmanager
    async def _stream_held(self, context: StreamContext) -> AsyncIterator[None]:
        """The block's stream counted as its client's, or refused before it is held:
        UNAUTHENTICATED without a valid key (when required), RESOURCE_EXHAUSTED past the
        client's `max_streams_per_client`."""
        try:
            client = self._client(context)
        except StrataError as exc:
            await context.abort(*status_of(exc))
        if not self._streams.take(client):
            limit = self._streams.limit
            await refuse(
                context, "streams_per_client", f"this client holds {limit} open streams already"
            )
        try:
            yield
        finally:
            self._streams.give(client)
