"""inference.GRPCInferenceService at the gateway: pipelines are the models clients see."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator

import grpc

from services.gateway.metrics import LATENCY, REQUESTS
from services.gateway.request import Answer, Budget, ClientRequest
from services.gateway.runtime import Runtime
from services.gateway.statistics import STATISTICS
from strata import codec
from strata.config import Pipeline
from strata.errors import NotFound, Unavailable, grpc_errors, status_of
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.telemetry import annotate, recording, shapes
from strata.v2meta import metadata_response, model_config
from strata.v2stream import answer_stream

PLATFORM = "strata_pipeline"
SERVER_NAME = "strata"
VERSION = "0.1.0"
PIPELINE_VERSION = "1"
ARM_PARAMETER = "strata.arm"


class GatewayServicer(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    @property
    def _pipelines(self) -> dict[str, Pipeline]:
        return self._runtime.settings.pipelines

    def _pipeline(self, name: str, version: str = "") -> Pipeline:
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            raise NotFound(f"unknown model {name!r}; pipelines: {sorted(self._pipelines)}")
        if version not in ("", PIPELINE_VERSION):
            raise NotFound(f"model {name!r} has no version {version!r}")
        return pipeline

    def _client(self, context: grpc.aio.ServicerContext) -> str:
        return self._runtime.admission.identify(context)

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        return v2.ServerLiveResponse(live=True)

    async def ServerReady(self, request, context) -> v2.ServerReadyResponse:
        states = await self._runtime.upstreams.healthy()
        inference = [up for name, up in states.items() if name.startswith("inference-")]
        ready = states["preprocess"] and states["postprocess"] and any(inference)
        return v2.ServerReadyResponse(ready=ready)

    async def ServerMetadata(self, request, context) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(name=SERVER_NAME, version=VERSION)

    @grpc_errors
    async def ModelReady(self, request, context) -> v2.ModelReadyResponse:
        self._client(context)
        pipeline = self._pipelines.get(request.name)
        if pipeline is None or request.version not in ("", PIPELINE_VERSION):
            return v2.ModelReadyResponse(ready=False)
        for route in self._runtime.router(request.name).routes:
            version = route.version or pipeline.model.version
            probe = v2.ModelReadyRequest(name=pipeline.model.name, version=version)
            hop = self._runtime.upstreams.inference[route.deployment]
            try:
                if (await hop.stub.ModelReady(probe, timeout=2.0)).ready:
                    return v2.ModelReadyResponse(ready=True)
            except grpc.aio.AioRpcError:
                continue
        return v2.ModelReadyResponse(ready=False)

    @grpc_errors
    async def ModelMetadata(self, request, context) -> v2.ModelMetadataResponse:
        self._client(context)
        pipeline = self._pipeline(request.name, request.version)
        return metadata_response(
            request.name, [PIPELINE_VERSION], PLATFORM, pipeline.inputs, pipeline.outputs
        )

    @grpc_errors
    async def ModelConfig(self, request, context) -> v2.ModelConfigResponse:
        self._client(context)
        pipeline = self._pipeline(request.name, request.version)
        return model_config(
            request.name, PLATFORM, pipeline.max_batch_size, pipeline.inputs, pipeline.outputs
        )

    @grpc_errors
    async def ModelStatistics(self, request, context) -> v2.ModelStatisticsResponse:
        """Each pipeline's numbers (services/gateway/statistics.py); all with no name."""
        self._client(context)
        names = [request.name] if request.name else sorted(self._pipelines)
        for name in names:
            self._pipeline(name, request.version)
        return v2.ModelStatisticsResponse(
            model_stats=[STATISTICS.model_statistics(name, PIPELINE_VERSION) for name in names]
        )

    @grpc_errors
    async def ModelInfer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        return await self._counted(request, context)

    async def ModelStreamInfer(
        self, requests: AsyncIterator[v2.ModelInferRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[v2.ModelStreamInferResponse]:
        """Each request of the stream through the pipeline on its own (strata.v2stream)."""
        infer = functools.partial(self._counted, context=context)
        async for answer in answer_stream(requests, infer):
            yield answer

    async def _counted(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        """One inference, counted and timed by pipeline and status code, and in the
        pipeline's statistics."""
        started = time.monotonic()
        code = "OK"
        response = None
        try:
            response = await self._infer(request, context)
            return response
        except Exception as exc:
            code = status_of(exc)[0].name
            raise
        finally:
            known = request.model_name in self._pipelines
            name = request.model_name if known else "(unknown)"
            seconds = time.monotonic() - started
            REQUESTS(name, code).inc()
            LATENCY(name).observe(seconds)
            if known:
                STATISTICS.finished(name, seconds, response)

    async def _infer(
        self, request: v2.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> v2.ModelInferResponse:
        runtime = self._runtime
        client = runtime.admission.admit(context)
        pipeline = self._pipeline(request.model_name, request.model_version)
        wanted = codec.requested_outputs(request, [spec.name for spec in pipeline.outputs])
        remaining = context.time_remaining()
        default = runtime.settings.gateway.default_timeout_seconds
        forced = request.parameters.get(ARM_PARAMETER)
        arrays = codec.request_inputs(request)
        if recording():
            annotate(pipeline=request.model_name, input_shapes=shapes(arrays))
        answer = await runtime.orchestrator.infer(
            ClientRequest(
                pipeline_name=request.model_name,
                pipeline=pipeline,
                arrays=arrays,
                inputs=codec.raw_inputs(request, arrays),
                request_id=request.id,
                client=client,
                forced_arm=forced.string_param if forced is not None else "",
                budget=Budget(default if remaining is None else remaining),
                parameters=_string_parameters(request),
            )
        )
        if recording():
            annotate(
                arm=answer.arm,
                model_version=answer.model_version,
                level=answer.level,
                degraded=answer.degraded or "no",
                output_shapes=shapes(answer.outputs),
            )
        return _response(request, answer, _produced(request.model_name, pipeline, answer, wanted))


def _string_parameters(request: v2.ModelInferRequest) -> dict[str, str]:
    """The client's string parameters, except the gateway's own (strata.*) and core_only."""
    return {
        key: value.string_param
        for key, value in request.parameters.items()
        if value.WhichOneof("parameter_choice") == "string_param"
        and not key.startswith("strata.")
        and key != "core_only"
    }


def _produced(name: str, pipeline: Pipeline, answer: Answer, wanted: list[str]) -> codec.Arrays:
    """The wanted outputs the answer has. An optional one a skipped rule did not make is
    left out (strata.skipped_rules names the rule); a required one fails the request."""
    missing = [name for name in wanted if name not in answer.outputs]
    optional = {spec.name for spec in pipeline.outputs if spec.optional}
    required = [name for name in missing if name not in optional]
    if required:
        skipped = answer.skipped_rules or "none"
        raise Unavailable(
            f"pipeline {name!r}: required output {required[0]!r} was not "
            f"produced (skipped rules: {skipped}); retry, or mark it optional"
        )
    return {name: answer.outputs[name] for name in wanted if name in answer.outputs}


def _response(request: v2.ModelInferRequest, answer: Answer, outputs: codec.Arrays):
    response = v2.ModelInferResponse(
        model_name=request.model_name, model_version=PIPELINE_VERSION, id=request.id
    )
    parameters = response.parameters
    parameters["strata.arm"].string_param = answer.arm
    parameters["strata.model_version"].string_param = answer.model_version
    parameters["strata.level"].int64_param = answer.level
    parameters["strata.degraded"].bool_param = bool(answer.degraded)
    if answer.degraded:
        parameters["strata.degraded_source"].string_param = answer.degraded
    if answer.cached:
        parameters["strata.cached"].bool_param = True
    if answer.skipped_rules:
        parameters["strata.skipped_rules"].string_param = answer.skipped_rules
    codec.add_outputs(response, outputs)
    return response
