"""Copies for a shadow route: the mirrored members' rows of what a model was sent and what
it gave, submitted to the shadow runner (shadow.py), decoded (rare, and off the answer's
path). The first model's are mirrored by the chain, a later stage's by its stages."""

from __future__ import annotations

from itertools import accumulate

from services.gateway.flow.flights import Member
from services.gateway.flow.rows import split
from services.gateway.flow.shadow import Copy, ShadowRunner
from services.gateway.upstream.router import Router
from strata.config.pipelines import Stage
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec


def mirror_first(
    runner: ShadowRunner,
    router: Router,
    members: list[Member],
    features: list[v1.Tensor],
    scores: list[v1.Tensor],
) -> None:
    """Submit to `runner` the members `router` (the pipeline's) mirrors: their rows of preprocess's
    outputs (`features`) and of the first model's (`scores`)."""
    first, shadow = members[0].request, router.shadow
    if shadow is None:
        return
    mirrored = [i for i, m in enumerate(members) if router.mirrors(_who(m))]
    if not mirrored:
        return
    rows = [m.rows for m in members]
    inputs = split(codec.tensors_to_arrays(features), rows)
    outputs = split(codec.tensors_to_arrays(scores), rows)
    name, model = first.pipeline_name, first.pipeline.model
    for i in mirrored:
        deadline = members[i].request.deadline
        runner.submit(Copy(name, model, shadow, inputs[i], outputs[i], deadline))


def mirror_stage(
    runner: ShadowRunner,
    router: Router,
    stage: Stage,
    members: list[Member],
    answered: list[int],
    rows: list[int],
    request: v2.ModelInferRequest,
    reply: v2.ModelInferResponse,
) -> None:
    """Submit to `runner` the `answered` members (of `members`, `rows` each in the call) that the
    stage's shadow mirrors (`router`, the stage's): each one's rows of the call's inputs and
    of what the stage's model gave for the answered members' rows (its own names, as the
    mirror's answer has them)."""
    shadow = router.shadow
    if shadow is None:
        return
    inputs, given = codec.request_inputs(request), codec.response_outputs(reply)
    sent = [0, *accumulate(rows)]
    back = [0, *accumulate(rows[i] for i in answered)]
    for n, i in enumerate(answered):
        if router.mirrors(_who(members[i])):
            sent_rows = {key: array[sent[i] : sent[i + 1]] for key, array in inputs.items()}
            given_rows = {key: array[back[n] : back[n + 1]] for key, array in given.items()}
            deadline = members[i].request.deadline
            copy = Copy(router.pipeline, stage.model, shadow, sent_rows, given_rows, deadline)
            runner.submit(copy)


def _who(member: Member) -> str:
    """What the mirror's sampling hashes: the request id, else the client."""
    return member.request.request_id or member.request.client
