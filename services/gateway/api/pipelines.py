"""The pipelines as the v2 models clients see, whichever protocol asks: readiness, metadata,
statistics and inference. The gRPC servicer and the REST API are thin adapters over this.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import grpc

from services.gateway.api import decoupled
from services.gateway.api.shared_memory import (
    REGION,
    SIZE,
    Placement,
    SharedMemory,
    output_places,
    with_inputs,
    write_outputs,
)
from services.gateway.door.forced_arm import ARM_PARAMETER
from services.gateway.door.policy import Checkpoint, Entry
from services.gateway.flow.classification import class_counts, classified
from services.gateway.flow.statistics import STATISTICS
from services.gateway.metrics import LATENCY, REQUESTS
from services.gateway.request import Answer, Caller, ClientRequest
from services.gateway.runtime import Runtime
from services.gateway.upstream.sequences import Sequences, request_flags
from strata import __version__, codec
from strata.config.pipelines import Fallback, ModelRef, Pipeline, Route
from strata.deadline import Deadline
from strata.errors import (
    InvalidArgument,
    NotFound,
    StrataError,
    Unavailable,
    Upstream,
    listed,
    shown,
    status_of,
)
from strata.proto.inference import grpc_service_pb2 as v2
from strata.sequences import FLAGS as SEQUENCE_FLAGS
from strata.telemetry import annotate, recording, shapes
from strata.v2meta import metadata_response, model_config

PLATFORM = "strata_pipeline"
SERVER_NAME = "strata"
PIPELINE_VERSION = "1"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "sequence",
    "sequence(string_id)",
    "statistics",
    "system_shared_memory",
]


@dataclass
class Count:
    """A counted request's answer, None until it has one."""

    response: v2.ModelInferResponse | None = None

    def answered(self, response: v2.ModelInferResponse) -> v2.ModelInferResponse:
        self.response = response
        return response


@dataclass(frozen=True)
class Made:
    """What one inference made, before it is sent: the request (its inputs read from shared
    memory), its pipeline and client, the answer, its wanted outputs, and where the client
    wants them placed in shared memory."""

    request: v2.ModelInferRequest
    pipeline: Pipeline
    client: str
    answer: Answer
    outputs: codec.Arrays
    places: dict[str, Placement]


class Pipelines:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        # Pipelines whose last request failed FAILED_PRECONDITION, the server's own fault (a
        # pipeline that does not make what it declares): not ready until one answers again.
        self._faulted: set[str] = set()
        self.memory = SharedMemory(lambda: runtime.settings.gateway.shared_memory)
        self.sequences = Sequences()

    @property
    def _pipelines(self) -> dict[str, Pipeline]:
        return self._runtime.settings.pipelines

    def names(self) -> list[str]:
        return sorted(self._pipelines)

    def pipeline(self, name: str, version: str = "") -> Pipeline:
        """The pipeline `name` (at `version`, when given); NOT_FOUND naming what exists."""
        pipeline = self._pipelines.get(name)
        if pipeline is None:
            raise NotFound(f"unknown model {shown(name)}; pipelines: {listed(self.names())}")
        if version not in ("", PIPELINE_VERSION):
            raise NotFound(f"model {shown(name)} has no version {shown(version)}")
        return pipeline

    def identify(self, caller: Caller) -> str:
        """The caller's client key (UNAUTHENTICATED without a valid API key, when required)."""
        return self._runtime.admission.identify(caller)

    def server_metadata(self) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(
            name=SERVER_NAME, version=__version__, extensions=EXTENSIONS
        )

    async def server_ready(self) -> bool:
        """Preprocess and postprocess are healthy, and every pipeline can answer (model_ready);
        under `gateway.ready_when: any_deployment`, one inference deployment is healthy."""
        states = await self._runtime.upstreams.healthy()
        if not (states["preprocess"] and states["postprocess"]):
            return False
        if self._runtime.settings.gateway.ready_when == "any_deployment":
            return any(up for name, up in states.items() if name.startswith("inference-"))
        return all(await asyncio.gather(*(self.model_ready(name) for name in self.names())))

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Whether any route of pipeline `name` has its model ready (or its fallback on any
        of its own), and so has each later stage's model or fallback (False if no such
        pipeline, or while its last request failed by the server's fault,
        FAILED_PRECONDITION)."""
        pipeline = self._pipelines.get(name)
        if pipeline is None or version not in ("", PIPELINE_VERSION) or name in self._faulted:
            return False
        settings = self._runtime.settings
        first = (pipeline.model, self._runtime.router(name).routes, pipeline.fallback)
        later = [(s.model, settings.model_routes(s.model), s.fallback) for s in pipeline.stages]
        for model, routes, fallback in [first, *later]:
            if not await self._either_ready(model, routes, fallback):
                return False
        return True

    async def _either_ready(
        self, model: ModelRef, routes: Sequence[Route], fallback: Fallback | None
    ) -> bool:
        """Whether `model` is ready on any of `routes`, or else its fallback on any of its own."""
        if await self._any_ready(model, routes):
            return True
        settings = self._runtime.settings
        return fallback is not None and await self._any_ready(
            fallback.model, settings.model_routes(fallback.model)
        )

    async def _any_ready(self, model: ModelRef, routes: Sequence[Route]) -> bool:
        """Whether `model` is ready on any of `routes`."""
        for route in routes:
            probe = v2.ModelReadyRequest(name=model.name, version=route.version or model.version)
            if await self._runtime.upstreams.inference[route.deployment].model_ready(probe):
                return True
        return False

    def model_metadata(self, name: str, version: str = "") -> v2.ModelMetadataResponse:
        pipeline = self.pipeline(name, version)
        return metadata_response(
            name, [PIPELINE_VERSION], PLATFORM, pipeline.inputs, pipeline.outputs
        )

    def model_config(self, name: str, version: str = "") -> v2.ModelConfigResponse:
        pipeline = self.pipeline(name, version)
        batch = pipeline.max_batch_size if pipeline.batched else 0
        return model_config(
            name,
            PLATFORM,
            batch,
            pipeline.inputs,
            pipeline.outputs,
            pipeline.sequence,
            decoupled=pipeline.decoupled is not None,
        )

    def model_statistics(self, name: str = "", version: str = "") -> v2.ModelStatisticsResponse:
        """Each pipeline's numbers (services/gateway/flow/statistics.py); all with no name.
        With a version one of its arms serves, one entry of that model version's numbers, as
        Triton answers per version; with none (or the pipeline's own "1", where no arm serves
        a version 1), the pipeline's whole numbers."""
        if not name:
            names = self.names()
            return v2.ModelStatisticsResponse(
                model_stats=[STATISTICS.model_statistics(each, PIPELINE_VERSION) for each in names]
            )
        pipeline = self.pipeline(name)
        served = self._versions_served(name, pipeline)
        if version in served:
            entry = STATISTICS.model_statistics(name, version, model_version=version)
        elif version in ("", PIPELINE_VERSION):
            entry = STATISTICS.model_statistics(name, PIPELINE_VERSION)
        else:
            raise NotFound(
                f"model {shown(name)} has no version {shown(version)}; its arms serve "
                f"versions: {listed(served)}"
            )
        return v2.ModelStatisticsResponse(model_stats=[entry])

    def _versions_served(self, name: str, pipeline: Pipeline) -> list[str]:
        """The model versions pipeline `name`'s arms name, and any that have answered it (an
        arm that names none serves whichever its deployment has)."""
        routes = self._runtime.router(name).routes
        named = {route.version or pipeline.model.version for route in routes}
        return sorted((named | set(STATISTICS.versions(name))) - {""})

    async def infer(self, request: v2.ModelInferRequest, caller: Caller) -> v2.ModelInferResponse:
        """One inference, counted (below)."""
        with self.counted(request.model_name, caller.protocol) as count:
            return count.answered(await self.answer(request, caller))

    @contextmanager
    def counted(self, name: str, protocol: str) -> Iterator[Count]:
        """The block's request for pipeline `name`, counted and timed by pipeline, status code
        and protocol, and in the pipeline's statistics, whether it answers or fails."""
        started = time.monotonic()
        code = "OK"
        count = Count()
        try:
            yield count
        except Exception as exc:
            code = status_of(exc)[0].name
            raise
        finally:
            known = name in self._pipelines
            seconds = time.monotonic() - started
            REQUESTS(name if known else "(unknown)", code, protocol).inc()
            LATENCY(name if known else "(unknown)", protocol).observe(seconds)
            if known:
                STATISTICS.finished(name, seconds, count.response)
                self._note_fault(name, code, count)

    def _note_fault(self, name: str, code: str, count: Count) -> None:
        if code == grpc.StatusCode.FAILED_PRECONDITION.name:
            self._faulted.add(name)
        elif count.response is not None:
            self._faulted.discard(name)

    async def answer(self, request: v2.ModelInferRequest, caller: Caller) -> v2.ModelInferResponse:
        """One inference's answer, for a unary call (ModelInfer, REST infer)."""
        made = await self._made(request, caller, streamed=False)
        placed = write_outputs(self.memory, made.client, made.places, made.outputs)
        return _response(made.request, made.answer, made.outputs, placed)

    async def stream_answer(
        self, request: v2.ModelInferRequest, caller: Caller
    ) -> list[v2.ModelInferResponse]:
        """One request of a stream, counted: its response, or a decoupled pipeline's zero or
        more (services/gateway/api/decoupled.py), with Triton's final flags where it asks."""
        name = request.model_name
        with self.counted(name, caller.protocol) as count, _unavailable_named(name):
            made = await self._made(request, caller, streamed=True)
            spec = made.pipeline.decoupled
            if spec is None:
                placed = write_outputs(self.memory, made.client, made.places, made.outputs)
                response = _response(made.request, made.answer, made.outputs, placed)
                return decoupled.flagged(request, count.answered(response), [response], False)
            head = count.answered(_response(made.request, made.answer, {}, {}))
            parts = decoupled.split(name, made.outputs, spec.max_responses)
            responses = [_response(made.request, made.answer, part, {}) for part in parts]
            return decoupled.flagged(request, head, responses, True)

    async def _made(self, request: v2.ModelInferRequest, caller: Caller, streamed: bool) -> Made:
        """One inference through the door (arrival's policies here, boarding's in the
        orchestrator), validation, the ladder, routing and flights; a decoupled pipeline's
        only on a stream (`streamed`)."""
        door = self._runtime.admission
        remaining = caller.time_remaining
        default = self._runtime.settings.gateway.default_timeout_seconds
        deadline = Deadline.after(default if remaining is None else remaining)
        client = door.identify(caller)
        entry = Entry(caller, request.model_name, client, _forced_arm(request), deadline)
        held = await door.admit(entry, Checkpoint.ARRIVAL)
        try:
            return await self._admitted(request, entry, streamed)
        finally:  # not an asynccontextmanager: that costs several times more a request
            door.leave(held, telling=False)

    async def _admitted(self, request: v2.ModelInferRequest, entry: Entry, streamed: bool) -> Made:
        """An inference the door admitted on arrival, from its pipeline to its outputs."""
        runtime, client, forced = self._runtime, entry.client, entry.forced_arm
        pipeline = self.pipeline(request.model_name, request.model_version)
        runtime.ladder.signals.arrived(request.model_name)
        if pipeline.decoupled is not None and not streamed:
            raise decoupled.unary_refused(request.model_name)
        wanted = codec.requested_outputs(request, [spec.name for spec in pipeline.outputs])
        sequence = request_flags(request, pipeline, client)
        counts = class_counts(request, pipeline)
        request = with_inputs(self.memory, client, request)
        places = output_places(self.memory, client, request)
        if places and pipeline.decoupled is not None:
            raise InvalidArgument(
                f"pipeline {shown(request.model_name)} is decoupled: its responses' outputs "
                "cannot go to shared memory (each would overwrite the last)"
            )
        arrays = codec.request_inputs(request)
        tracing = recording()
        if tracing:
            annotate(pipeline=request.model_name, input_shapes=shapes(arrays))
        req = ClientRequest(
            pipeline_name=request.model_name,
            pipeline=pipeline,
            arrays=arrays,
            inputs=codec.raw_inputs(request, arrays),
            request_id=request.id,
            client=client,
            forced_arm=forced,
            deadline=entry.deadline,
            parameters=_string_parameters(request),
            sequence=sequence,
            caller=entry.caller,
        )
        if sequence is None:
            answer = await runtime.orchestrator.infer(req)
        else:
            answer = await self.sequences.infer(req, sequence, runtime.orchestrator.infer)
        if tracing:
            annotate(
                arm=answer.arm,
                model_version=answer.model_version,
                level=answer.level,
                degraded=answer.degraded or "no",
                output_shapes=shapes(answer.outputs),
            )
        produced = _produced(request.model_name, pipeline, answer, wanted)
        outputs = classified(produced, counts, pipeline)
        return Made(request, pipeline, client, answer, outputs, places)


@contextmanager
def _unavailable_named(pipeline: str) -> Iterator[None]:
    """The block's UNAVAILABLE (a replica gone, say) naming the pipeline: on a stream that
    carries many pipelines' requests, the message is what a client's callback sees."""
    try:
        yield
    except StrataError as exc:
        if exc.code != grpc.StatusCode.UNAVAILABLE or shown(pipeline) in str(exc):
            raise
        raise Upstream(exc.code, f"pipeline {shown(pipeline)}: {exc}") from None


def _forced_arm(request: v2.ModelInferRequest) -> str:
    """The arm the request forces with the `strata.arm` parameter ("" for none)."""
    forced = request.parameters.get(ARM_PARAMETER)
    return forced.string_param if forced is not None else ""


def _string_parameters(request: v2.ModelInferRequest) -> dict[str, str]:
    """The client's string parameters, except the gateway's own (strata.*) and core_only."""
    return {
        key: value.string_param
        for key, value in request.parameters.items()
        if value.WhichOneof("parameter_choice") == "string_param"
        and not key.startswith("strata.")
        and key != "core_only"
        and key not in SEQUENCE_FLAGS
    }


def _produced(name: str, pipeline: Pipeline, answer: Answer, wanted: list[str]) -> codec.Arrays:
    """The wanted outputs the answer has. An optional one a skipped rule did not make is
    left out (strata.skipped_rules names the rule); a required one fails the request."""
    missing = [name for name in wanted if name not in answer.outputs]
    if not missing:
        return {name: answer.outputs[name] for name in wanted}
    optional = {spec.name for spec in pipeline.outputs if spec.optional}
    required = [name for name in missing if name not in optional]
    if required:
        skipped = answer.skipped_rules or "none"
        raise Unavailable(
            f"pipeline {name!r}: required output {required[0]!r} was not "
            f"produced (skipped rules: {skipped}); retry, or mark it optional"
        )
    return {name: answer.outputs[name] for name in wanted if name in answer.outputs}


def _response(
    request: v2.ModelInferRequest,
    answer: Answer,
    outputs: codec.Arrays,
    placed: dict[str, Placement],
) -> v2.ModelInferResponse:
    """The answer; an output written into shared memory (`placed`) is described with its
    region and byte size and no data (an empty raw entry keeps the others' places, as
    tritonclient reads them)."""
    # The version that answered, as strata.model_version says ("" for a default answer).
    response = v2.ModelInferResponse(
        model_name=request.model_name, model_version=answer.model_version, id=request.id
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
    if answer.stages:
        parameters["strata.stages"].string_param = answer.stages
    for name, array in outputs.items():
        place = placed.get(name)
        if place is None:
            codec.add_outputs(response, {name: array})
            continue
        datatype = codec.datatype_of(array)
        tensor = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        tensor.parameters[REGION].string_param = place.region
        tensor.parameters[SIZE].int64_param = place.size
        response.raw_output_contents.append(b"")
    return response
