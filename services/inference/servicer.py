"""inference.GRPCInferenceService on the inference layer, thin: inference requests go to the
data plane (dataplane.py), the rest to the model manager.

Serves v2 inference, metadata and statistics, and the repository extension (index, load,
unload) that hot-swaps model versions; all three need the admin token (strata.security.bearer): the
index names every model folder and why a version was refused, which is the operator's.

Readiness follows what is loaded: ServerReady is true only while every configured model
serves, and the health service reports each one as `model/<name>`. A configured model that is
not loaded answers UNAVAILABLE, so the gateway retries another replica or fails over to
another arm.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from grpc.aio import ServicerContext as Context
from grpc_health.v1 import health_pb2

from services.inference.dataplane import DataPlane
from services.inference.index import index_response
from services.inference.manager import ModelManager
from services.inference.sequences import client_tensors
from services.inference.slabs import SlabInputs
from services.inference.statistics import statistics_response
from strata import __version__
from strata.calls.grpc_errors import answers_unimplemented, grpc_errors
from strata.calls.streams import DEFAULT_MAX_IN_FLIGHT
from strata.calls.v2stream import answer_stream
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.rpc.server import Running
from strata.security.bearer import ControlAuth
from strata.telemetry.tracing import server_span
from strata.wire import flight
from strata.wire.deadline import Deadline
from strata.wire.v2meta import metadata_response, model_config

PLATFORM = "onnxruntime_onnx"
SERVER_NAME = "strata-inference"
EXTENSIONS = ["model_repository", "statistics"]
STREAM_METHOD = "/inference.GRPCInferenceService/ModelStreamInfer"
MODEL_HEALTH = "model/"  # health service name of a configured model: "model/digits"


@answers_unimplemented(
    v2_grpc.GRPCInferenceServiceServicer,
    "Strata's inference service",
    {"SystemSharedMemory": "clients pass tensors through shared memory at the gateway"},
)
class InferenceServicer(v2_grpc.GRPCInferenceServiceServicer):
    """The v2 protocol over the model manager."""

    def __init__(
        self,
        models: ModelManager,
        settings: InferenceSettings,
        max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        local_control: bool = False,
        slabs: SlabInputs | None = None,
    ) -> None:
        """`local_control`: the repository API without the token (gateway.local_model_control,
        which the config allows only with every listener on loopback); `slabs`: inputs a
        gateway of this host sent through shared memory, where on."""
        self._models = models
        self._configured = list(models.configured)
        self._plane = DataPlane(models, self._configured, slabs)
        self._max_stream_in_flight = max_stream_in_flight
        token = settings.admin_token.get_secret_value() if settings.admin_token else None
        self._auth = ControlAuth("the model repository API", "inference.admin_token", lambda: token)
        self._local_control = local_control
        self._running: Running | None = None

    def _control(self, context: Context[Any, Any]) -> None:
        """A repository call let through: with the token, or under local control."""
        if not self._local_control:
            self._auth.check(context)

    async def report_health(self, running: Running) -> None:
        """Report each configured model on `running`'s health service, now and after every
        load or unload; at shutdown they turn NOT_SERVING with the server's own names."""
        running.names.extend(MODEL_HEALTH + name for name in self._configured)
        self._running = running
        await self._publish_health()

    async def _publish_health(self) -> None:
        if self._running is None:
            return
        status = health_pb2.HealthCheckResponse
        for name in self._configured:
            serving = self._models.ready(name)
            await self._running.health.set(
                MODEL_HEALTH + name, status.SERVING if serving else status.NOT_SERVING
            )

    async def ServerLive(
        self,
        request: v2.ServerLiveRequest,
        context: Context[v2.ServerLiveRequest, v2.ServerLiveResponse],
    ) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    @grpc_errors
    async def ServerReady(
        self,
        request: v2.ServerReadyRequest,
        context: Context[v2.ServerReadyRequest, v2.ServerReadyResponse],
    ) -> v2.ServerReadyResponse:
        ready = all(self._models.ready(name) for name in self._configured)
        return v2.ServerReadyResponse(ready=ready)

    @grpc_errors
    async def ModelReady(
        self,
        request: v2.ModelReadyRequest,
        context: Context[v2.ModelReadyRequest, v2.ModelReadyResponse],
    ) -> v2.ModelReadyResponse:
        return v2.ModelReadyResponse(ready=self._models.ready(request.name, request.version))

    async def ServerMetadata(
        self,
        request: v2.ServerMetadataRequest,
        context: Context[v2.ServerMetadataRequest, v2.ServerMetadataResponse],
    ) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(
            name=SERVER_NAME, version=__version__, extensions=EXTENSIONS
        )

    @grpc_errors
    async def ModelMetadata(
        self,
        request: v2.ModelMetadataRequest,
        context: Context[v2.ModelMetadataRequest, v2.ModelMetadataResponse],
    ) -> v2.ModelMetadataResponse:
        model = self._models.resolve(request.name, request.version)
        versions = self._models.serving()[model.name] if not request.version else [request.version]
        inputs, outputs = client_tensors(model)
        return metadata_response(model.name, versions, PLATFORM, inputs, outputs)

    @grpc_errors
    async def ModelConfig(
        self,
        request: v2.ModelConfigRequest,
        context: Context[v2.ModelConfigRequest, v2.ModelConfigResponse],
    ) -> v2.ModelConfigResponse:
        model = self._models.resolve(request.name, request.version)
        signature = model.signature
        return model_config(
            model.name,
            PLATFORM,
            model.max_batch_size,
            signature.inputs,
            signature.outputs,
            model.spec.sequence,
        )

    @grpc_errors
    async def ModelInfer(
        self,
        request: v2.ModelInferRequest,
        context: Context[v2.ModelInferRequest, v2.ModelInferResponse],
    ) -> v2.ModelInferResponse:
        return await self._plane.infer(request, Deadline.within(context.time_remaining()))

    async def ModelStreamInfer(
        self,
        requests: AsyncIterator[v2.ModelInferRequest],
        context: Context[v2.ModelInferRequest, v2.ModelStreamInferResponse],
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each request of the stream batched and answered on its own (strata.calls.v2stream); a
        request's deadline is its `timeout` parameter, or the stream's."""

        async def infer(request: v2.ModelInferRequest) -> list[v2.ModelInferResponse]:
            traceparent = flight.call_traceparent(request.parameters)
            stream = Deadline.within(context.time_remaining())
            if not traceparent:
                return [await self._plane.infer(request, stream)]
            with server_span(STREAM_METHOD, {"traceparent": traceparent}):
                return [await self._plane.infer(request, stream)]

        async for answer in answer_stream(requests, infer, self._max_stream_in_flight):
            yield answer

    @grpc_errors
    async def ModelStatistics(
        self,
        request: v2.ModelStatisticsRequest,
        context: Context[v2.ModelStatisticsRequest, v2.ModelStatisticsResponse],
    ) -> v2.ModelStatisticsResponse:
        return statistics_response(self._models.statistics(request.name, request.version))

    @grpc_errors
    async def RepositoryIndex(
        self,
        request: v2.RepositoryIndexRequest,
        context: Context[v2.RepositoryIndexRequest, v2.RepositoryIndexResponse],
    ) -> v2.RepositoryIndexResponse:
        self._control(context)
        return index_response(self._models.index(ready_only=request.ready))

    @grpc_errors
    async def RepositoryModelLoad(
        self,
        request: v2.RepositoryModelLoadRequest,
        context: Context[v2.RepositoryModelLoadRequest, v2.RepositoryModelLoadResponse],
    ) -> v2.RepositoryModelLoadResponse:
        self._control(context)
        if request.parameters:
            # Triton's `config` and `file:` overrides would serve what no validation case
            # checked against the repository; the repository is the one source.
            raise InvalidArgument(
                f"load parameters {sorted(request.parameters)} are not supported: a model's "
                "settings and files come from its folder in the repository (model.yaml)"
            )
        try:
            await self._models.load(request.model_name)
        finally:
            await self._publish_health()
        return v2.RepositoryModelLoadResponse()

    @grpc_errors
    async def RepositoryModelUnload(
        self,
        request: v2.RepositoryModelUnloadRequest,
        context: Context[v2.RepositoryModelUnloadRequest, v2.RepositoryModelUnloadResponse],
    ) -> v2.RepositoryModelUnloadResponse:
        self._control(context)
        try:
            await self._models.unload(request.model_name)
        finally:
            await self._publish_health()
        return v2.RepositoryModelUnloadResponse()
