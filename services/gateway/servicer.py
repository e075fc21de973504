"""inference.GRPCInferenceService at the gateway: pipelines are the models clients see."""

from __future__ import annotations

import grpc

from services.gateway.orchestrator import Budget, Orchestrator
from services.gateway.upstreams import Upstreams
from strata import codec
from strata.config import Pipeline, Settings
from strata.errors import NotFound, grpc_errors
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.v2meta import Tensor, metadata_response, model_config

PLATFORM = "strata_pipeline"
SERVER_NAME = "strata"
VERSION = "0.1.0"
PIPELINE_VERSION = "1"


class GatewayServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, settings: Settings, upstreams: Upstreams) -> None:
        self._pipelines = settings.pipelines
        self._default_timeout = settings.gateway.default_timeout_seconds
        self._upstreams = upstreams
        self._orchestrator = Orchestrator(upstreams)

    def _pipeline(self, name: str, version: str = "") -> Pipeline:
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            raise NotFound(f"unknown model {name!r}; pipelines: {sorted(self._pipelines)}")
        if version not in ("", PIPELINE_VERSION):
            raise NotFound(f"model {name!r} has no version {version!r}")
        return pipeline

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        states = await self._upstreams.healthy()
        return v2.ServerReadyResponse(ready=all(states.values()))

    async def ServerMetadata(self, request, context) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION)

    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        pipeline = self._pipelines.get(request.name)
        if pipeline is None or request.version not in ("", PIPELINE_VERSION):
            return v2.ModelReadyResponse(ready=False)
        probe = v2.ModelReadyRequest(name=pipeline.model.name, version=pipeline.model.version)
        try:
            reply = await self._upstreams.inference.ModelReady(probe, timeout=2.0)
        except grpc.aio.AioRpcError:
            return v2.ModelReadyResponse(ready=False)
        return v2.ModelReadyResponse(ready=reply.ready)

    @grpc_errors
    async def ModelMetadata(self, request, context) -> v2.ModelMetadataResponse:
        pipeline = self._pipeline(request.name, request.version)
        inputs, outputs = _tensors(pipeline)
        return metadata_response(request.name, [PIPELINE_VERSION], PLATFORM, inputs, outputs)

    @grpc_errors
    async def ModelConfig(self, request, context) -> v2.ModelConfigResponse:
        pipeline = self._pipeline(request.name, request.version)
        inputs, outputs = _tensors(pipeline)
        return model_config(request.name, PLATFORM, pipeline.max_batch_size, inputs, outputs)

    @grpc_errors
    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        pipeline = self._pipeline(request.model_name, request.model_version)
        wanted = codec.requested_outputs(request, [spec.name for spec in pipeline.outputs])
        arrays = codec.request_inputs(request)
        remaining = context.time_remaining()
        budget = Budget(self._default_timeout if remaining is None else remaining)
        answer = await self._orchestrator.infer(
            request.model_name, pipeline, arrays, request.id, budget
        )
        response = v2.ModelInferResponse(
            model_name=request.model_name, model_version=PIPELINE_VERSION, id=request.id
        )
        response.parameters["model_version"].string_param = answer.model_version
        codec.add_outputs(response, {name: answer.outputs[name] for name in wanted})
        return response


def _tensors(pipeline: Pipeline) -> tuple[list[Tensor], list[Tensor]]:
    def tensors(specs) -> list[Tensor]:
        return [Tensor(s.name, s.datatype, s.shape) for s in specs]

    return tensors(pipeline.inputs), tensors(pipeline.outputs)
