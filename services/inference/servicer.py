"""inference.GRPCInferenceService on the inference layer: thin decode -> run -> encode."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

import grpc

from services.inference.model import LoadedModel
from strata import codec
from strata.errors import NotFound, grpc_errors
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.v2meta import Tensor, metadata_response, model_config

PLATFORM = "onnxruntime_onnx"
SERVER_NAME = "strata-inference"
VERSION = "0.1.0"


class InferenceServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, models: dict[str, LoadedModel], executor: Executor) -> None:
        self._models = models
        self._executor = executor

    def _model(self, name: str, version: str) -> LoadedModel:
        model = self._models.get(name)
        if model is None:
            raise NotFound(f"unknown model {name!r}; serving {sorted(self._models)}")
        if version and version != model.version:
            raise NotFound(f"model {name!r} has no version {version!r} (serving {model.version})")
        return model

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=True)

    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        model = self._models.get(request.name)
        ready = model is not None and request.version in ("", model.version)
        return v2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION)

    @grpc_errors
    async def ModelMetadata(self, request, context) -> v2.ModelMetadataResponse:
        model = self._model(request.name, request.version)
        return metadata_response(
            model.name, [model.version], PLATFORM, _tensors(model.inputs), _tensors(model.outputs)
        )

    @grpc_errors
    async def ModelConfig(self, request, context) -> v2.ModelConfigResponse:
        model = self._model(request.name, request.version)
        return model_config(
            model.name,
            PLATFORM,
            model.max_batch_size,
            _tensors(model.inputs),
            _tensors(model.outputs),
        )

    @grpc_errors
    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        model = self._model(request.model_name, request.model_version)
        arrays = codec.request_inputs(request)
        model.check(arrays)
        wanted = codec.requested_outputs(request, [info.name for info in model.outputs])
        loop = asyncio.get_running_loop()
        outputs = await loop.run_in_executor(self._executor, model.run, arrays)
        response = v2.ModelInferResponse(
            model_name=model.name, model_version=model.version, id=request.id
        )
        codec.add_outputs(response, {name: outputs[name] for name in wanted})
        return response


def _tensors(infos) -> list[Tensor]:
    return [Tensor(info.name, info.datatype, info.shape) for info in infos]
