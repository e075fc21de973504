"""inference.GRPCInferenceService on the inference layer: thin decode -> domain -> encode.

Serves v2 inference, metadata and statistics, and the repository extension (index, load,
unload) that hot-swaps model versions.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator

import grpc

from services.inference import reports
from services.inference.manager import ModelManager
from services.inference.model import ModelVersion
from services.inference.params import request_options
from strata import codec
from strata.errors import InvalidArgument, grpc_errors
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.v2meta import metadata_response, model_config
from strata.v2stream import answer_stream

PLATFORM = "onnxruntime_onnx"
SERVER_NAME = "strata-inference"
VERSION = "0.1.0"
EXTENSIONS = ["model_repository", "statistics"]


class InferenceServicer(v2_grpc.GRPCInferenceServiceServicer):
    """The v2 protocol over the model manager."""

    def __init__(self, models: ModelManager) -> None:
        self._models = models

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        return v2.ServerReadyResponse(ready=self._models.all_ready())

    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        return v2.ModelReadyResponse(ready=self._models.ready(request.name, request.version))

    async def ServerMetadata(self, request, context) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION, extensions=EXTENSIONS)

    @grpc_errors
    async def ModelMetadata(self, request, context) -> v2.ModelMetadataResponse:
        model = self._models.resolve(request.name, request.version)
        versions = self._models.serving()[model.name] if not request.version else [request.version]
        signature = model.signature
        return metadata_response(
            model.name, versions, PLATFORM, signature.inputs, signature.outputs
        )

    @grpc_errors
    async def ModelConfig(self, request, context) -> v2.ModelConfigResponse:
        model = self._models.resolve(request.name, request.version)
        signature = model.signature
        return model_config(
            model.name,
            PLATFORM,
            model.max_batch_size,
            signature.inputs,
            signature.outputs,
        )

    @grpc_errors
    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        return await self._infer(request, context)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[v2.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each request of the stream batched and answered on its own (strata.v2stream); a
        request's deadline is its `timeout` parameter, or the stream's."""
        infer = functools.partial(self._infer, context=context)
        async for answer in answer_stream(requests, infer):
            yield answer

    async def _infer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        model = self._models.resolve(request.model_name, request.model_version)
        wanted = codec.requested_outputs(request, model.signature.output_names)
        arrays = codec.request_inputs(request)
        now = asyncio.get_running_loop().time()
        options = request_options(request.parameters, context.time_remaining(), now)
        outputs = await model.infer(arrays, options)
        return _response(model, request.id, {name: outputs[name] for name in wanted})

    @grpc_errors
    async def ModelStatistics(self, request, context) -> v2.ModelStatisticsResponse:
        return reports.statistics_response(self._models.statistics(request.name, request.version))

    @grpc_errors
    async def RepositoryIndex(self, request, context) -> v2.RepositoryIndexResponse:
        return reports.index_response(self._models.index(ready_only=request.ready))

    @grpc_errors
    async def RepositoryModelLoad(self, request, context) -> v2.RepositoryModelLoadResponse:
        if request.parameters:
            # Triton's `config` and `file:` overrides would serve what no validation case
            # checked against the repository; the repository is the one source.
            raise InvalidArgument(
                f"load parameters {sorted(request.parameters)} are not supported: a model's "
                "settings and files come from its folder in the repository (model.yaml)"
            )
        await self._models.load(request.model_name)
        return v2.RepositoryModelLoadResponse()

    @grpc_errors
    async def RepositoryModelUnload(self, request, context) -> v2.RepositoryModelUnloadResponse:
        await self._models.unload(request.model_name)
        return v2.RepositoryModelUnloadResponse()


def _response(model: ModelVersion, request_id: str, outputs: dict) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(
        model_name=model.name, model_version=str(model.version), id=request_id
    )
    codec.add_outputs(response, outputs)
    return response
