"""Sequences at the gateway: each one's requests in order, on one arm and one replica.

A pipeline with `sequence:` (strata.wire.triton_sequences.PipelineSequence) runs a stateful model,
whose state lives in the inference replica that served the sequence's START. The gateway keeps
each sequence's requests one at a time, in the order they arrived; sends each one alone
(never in a flight, never from the cache, never mirrored); remembers the arm its START was
answered on and sends the rest there, with no fail-over (another arm has not its state);
and picks its replica by the sequence's key among the deployment's listed replicas. The id
goes to inference with the client's key beside it (strata.wire.triton_sequences.SCOPE): one client's
ids never reach another's sequences.

A request of a sequence the gateway does not know without START (another gateway replica
took its start, or this one restarted) still goes on, to the arm the client's stickiness
picks: the replica that holds the sequence answers it, or says it is not active. A sequence
flag on a stateless pipeline is refused: answering it as if it stood alone would ignore the
id and flags and assume the model's state.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from services.gateway.metrics import SEQUENCES
from services.gateway.request import Answer, ClientRequest
from services.gateway.upstream.router import unit_hash
from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.flight import Writable
from strata.wire.triton_sequences import (
    FLAGS,
    SCOPE,
    SEQUENCE_END,
    SEQUENCE_ID,
    SEQUENCE_START,
    Books,
    Flags,
    sequence_flags,
)

Infer = Callable[[ClientRequest], Awaitable[Answer]]


def request_flags(request: v2.ModelInferRequest, pipeline: Pipeline, client: str) -> Flags | None:
    """The request's sequence flags, scoped to `client`; None for a request of no sequence.
    INVALID_ARGUMENT for a flag sent to a stateless pipeline, or bad flags."""
    if pipeline.sequence is None:
        parameters = request.parameters  # `in` first: half the cost of get() where absent
        given = [key for key in FLAGS if key in parameters and _given(parameters[key])]
        if given:
            raise InvalidArgument(
                f"pipeline {shown(request.model_name)} is stateless: it takes no sequence "
                f"({', '.join(given)}); send each request on its own, without them"
            )
        return None
    flags = sequence_flags(request.parameters)
    if flags is None:
        raise InvalidArgument(
            f"pipeline {shown(request.model_name)} is stateful: each request belongs to a "
            "sequence; send sequence_id, with sequence_start on a sequence's first request"
        )
    return Flags(flags.id, flags.start, flags.end, client)


def _given(value: v2.InferParameter | None) -> bool:
    """Whether a parameter is there with a value other than its default (0, "", false)."""
    choice = value.WhichOneof("parameter_choice") if value is not None else None
    return choice is not None and bool(getattr(value, choice))


class Sequences:
    """The live sequences of every stateful pipeline: each one's arm."""

    def __init__(self) -> None:
        self._books = Books[str]("pipeline")

    async def infer(self, req: ClientRequest, flags: Flags, infer: Infer) -> Answer:
        """Answer one request of a sequence with `infer`, in its turn, on its arm."""
        _one_row(req)
        sequence = req.pipeline.sequence
        assert sequence is not None  # request_flags gives flags only where there is one
        live = self._books.of(
            req.pipeline_name, sequence.max_sequence_idle_microseconds, sequence.max_sequences
        )
        try:
            async with live.turn(flags, lambda: "", unknown=True) as entry:
                if entry.value and not flags.start:
                    req.forced_arm = entry.value
                answer = await infer(req)
                entry.value = answer.arm
        finally:
            SEQUENCES(req.pipeline_name).set(len(live))
        return answer


def _one_row(req: ClientRequest) -> None:
    if not req.pipeline.batched:
        return
    rows = {array.shape[0] for array in req.arrays.values() if array.ndim}
    if rows != {1}:
        raise InvalidArgument(
            f"a request of a sequence holds one row (batch 1); pipeline "
            f"{shown(req.pipeline_name)} got {sorted(rows)}"
        )


def replica(flags: Flags, count: int) -> int:
    """Which of `count` replicas holds the sequence: the same on every gateway replica."""
    return int(unit_hash("sequence", flags.scope, str(flags.id)) * count)


def add_parameters(parameters: Writable, flags: Flags) -> None:
    """The sequence's flags on the model's request, with the client's key beside its id."""
    if isinstance(flags.id, str):
        parameters[SEQUENCE_ID].string_param = flags.id
    else:
        parameters[SEQUENCE_ID].uint64_param = flags.id
    parameters[SEQUENCE_START].bool_param = flags.start
    parameters[SEQUENCE_END].bool_param = flags.end
    parameters[SCOPE].string_param = flags.scope
