"""One inference, from the door to its outputs: the caller admitted on arrival (boarding's
policies are asked in the orchestrator), the request checked against its pipeline, its inputs
read from shared memory where they lie there, decoded into a `ClientRequest`, answered through
the flow (or its sequence), and its wanted outputs picked from the answer."""

from __future__ import annotations

from dataclasses import dataclass

from services.gateway.door.forced_arm import ARM_PARAMETER
from services.gateway.door.policy import Checkpoint, Entry
from services.gateway.flow.classification import class_counts, classified
from services.gateway.request import Answer, Caller, ClientRequest
from services.gateway.runtime import Runtime
from services.gateway.serving import decoupled
from services.gateway.serving.catalog import Catalog
from services.gateway.serving.shared_memory import (
    Placement,
    SharedMemory,
    output_places,
    with_inputs,
)
from services.gateway.upstream.sequences import Sequences, request_flags
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument, Unavailable, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.telemetry.tracing import annotate, recording, shapes
from strata.wire import codec
from strata.wire.deadline import Deadline
from strata.wire.triton_sequences import FLAGS as SEQUENCE_FLAGS
from strata.wire.triton_sequences import Flags


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


class Inference:
    def __init__(
        self, runtime: Runtime, catalog: Catalog, memory: SharedMemory, sequences: Sequences
    ) -> None:
        self._runtime, self._catalog = runtime, catalog
        self._memory, self._sequences = memory, sequences

    async def made(self, request: v2.ModelInferRequest, caller: Caller, streamed: bool) -> Made:
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
        pipeline = self._accepted(request, streamed)
        wanted = codec.requested_outputs(request, [spec.name for spec in pipeline.outputs])
        sequence = request_flags(request, pipeline, entry.client)
        counts = class_counts(request, pipeline)
        request, places = self._from_memory(request, pipeline, entry.client)
        answer = await self._answer(_client_request(request, pipeline, entry, sequence))
        produced = _produced(request.model_name, pipeline, answer, wanted)
        outputs = classified(produced, counts, pipeline)
        return Made(request, pipeline, entry.client, answer, outputs, places)

    def _accepted(self, request: v2.ModelInferRequest, streamed: bool) -> Pipeline:
        """The request's pipeline, its arrival told to the ladder; a decoupled one only on a
        stream."""
        pipeline = self._catalog.pipeline(request.model_name, request.model_version)
        self._runtime.ladder.signals.arrived(request.model_name)
        if pipeline.decoupled is not None and not streamed:
            raise decoupled.unary_refused(request.model_name)
        return pipeline

    def _from_memory(
        self, request: v2.ModelInferRequest, pipeline: Pipeline, client: str
    ) -> tuple[v2.ModelInferRequest, dict[str, Placement]]:
        """The request with its inputs read from the client's shared memory where they lie
        there, and where the client wants its outputs placed."""
        request = with_inputs(self._memory, client, request)
        places = output_places(self._memory, client, request)
        if places and pipeline.decoupled is not None:
            raise InvalidArgument(
                f"pipeline {shown(request.model_name)} is decoupled: its responses' outputs "
                "cannot go to shared memory (each would overwrite the last)"
            )
        return request, places

    async def _answer(self, req: ClientRequest) -> Answer:
        """The request's answer through the flow, or through its sequence where it has one."""
        infer = self._runtime.orchestrator.infer
        if req.sequence is None:
            answer = await infer(req)
        else:
            answer = await self._sequences.infer(req, req.sequence, infer)
        if recording():
            annotate(
                arm=answer.arm,
                model_version=answer.model_version,
                level=answer.level,
                degraded=answer.degraded or "no",
                output_shapes=shapes(answer.outputs),
            )
        return answer


def _client_request(
    request: v2.ModelInferRequest, pipeline: Pipeline, entry: Entry, sequence: Flags | None
) -> ClientRequest:
    """The request as the gateway carries it, its inputs decoded (their shapes on its span)."""
    arrays, inputs = codec.client_inputs(request)
    if recording():
        annotate(pipeline=request.model_name, input_shapes=shapes(arrays))
    return ClientRequest(
        pipeline_name=request.model_name,
        pipeline=pipeline,
        arrays=arrays,
        inputs=inputs,
        request_id=request.id,
        client=entry.client,
        forced_arm=entry.forced_arm,
        deadline=entry.deadline,
        parameters=_string_parameters(request),
        sequence=sequence,
        caller=entry.caller,
    )


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
