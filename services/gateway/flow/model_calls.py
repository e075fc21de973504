"""One way to call a model for a flight: its first model, a later stage, a fallback alike.

A call is one ModelInfer on one arm for some of a flight's members, each with its rows of
the stacked inputs: on the hop to the arm's deployment (a sequence's on its replica), by the
last of the members' deadlines, bounded by the hop's own timeout where another arm could
answer should this one hang (`spare`). Every call counts in its arm's figures under the
model's name there (`<pipeline>` for the first model, `<pipeline>/<stage>` for a later one,
`.../fallback` for a fallback) and teaches the model's usual seconds; every refusal is blamed
on whoever made the tensors (blame.py: a server-side mistake is never the client's).

What becomes of the members a model could not answer is decided here too (`after`): another
arm of the model where theirs was unavailable and they may still move (once), the model's
fallback where that answers for their error (fallback.py), else they fail with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from services.gateway.flow.fallback import answers_for
from services.gateway.flow.flights import Member
from services.gateway.metrics import FAILOVERS
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from services.gateway.upstream.sequences import add_parameters
from services.gateway.upstream.upstreams import Upstreams
from strata.config.pipelines import ModelRef, Route
from strata.errors import StrataError, Unavailable
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.deadline import latest
from strata.wire.flight import FlightMember, member_errors, set_members
from strata.wire.slab import ASK

# How fast a model's usual seconds follow its latest calls.
SMOOTHING = 0.2


@dataclass(frozen=True)
class Model:
    """A model as a flight calls it: its name in the arms' figures, the model, the router
    over its arms, how its refusals are blamed, and whether a fallback may answer for the
    members it could not (the errors it answers for: fallback.FALLS_BACK)."""

    figures: str
    ref: ModelRef
    router: Router
    blame: Callable[[StrataError], StrataError]
    has_fallback: bool


@dataclass(frozen=True)
class Reply:
    """What one call gave: the model's outputs over the rows it answered, its version, each
    member's own error (blamed; by index in the call), and the request and reply as they went
    (for a shadow's copy)."""

    outputs: list[v1.Tensor]
    version: str
    errors: dict[int, StrataError]
    request: v2.ModelInferRequest
    reply: v2.ModelInferResponse


@dataclass
class Next:
    """Where the members a model could not answer go (by index): to another arm, moved
    there by arm, or to the model's fallback; the others failed with their error."""

    moved: dict[str, tuple[Route, list[int]]] = field(default_factory=dict)
    fallback: list[int] = field(default_factory=list)


class ModelCalls:
    """Calls models for flights, and says where what they could not answer goes."""

    def __init__(
        self, upstreams: Upstreams, arms: ArmBook, usable: Callable[[Route], bool]
    ) -> None:
        """Calls over `upstreams`, counted in `arms`; `usable`: whether a route's deployment
        may take a call now (its breaker closed)."""
        self._up = upstreams
        self._arms = arms
        self._usable = usable
        self._usual: dict[str, float] = {}  # each model's usual seconds per call, by figures

    async def call(
        self,
        model: Model,
        route: Route,
        members: list[Member],
        rows: list[int],
        inputs: list[v1.Tensor],
        *,
        spare: bool,
    ) -> Reply:
        """One ModelInfer of `model` on `route` over `inputs` (`rows` of each member's);
        `spare`: whether another arm could take them, should this one hang. Raises the
        call's error, blamed, where it answered none of them."""
        version = route.version or model.ref.version
        request = model_request(model.ref.name, version, members, rows, inputs)
        hop = self._up.inference_hop(route.deployment, members[0].request.sequence)
        deadline = latest(m.deadline for m in members)
        started = time.monotonic()
        try:
            reply = await hop.call("ModelInfer", request, deadline, spare=spare)
            outputs = codec.response_tensors(reply, f"inference deployment {route.deployment!r}")
        except StrataError as exc:
            self._arms.record(model.figures, route.arm, exc.code.name, 0.0, len(members))
            raise model.blame(exc) from None
        seconds = time.monotonic() - started
        self._arms.record(model.figures, route.arm, "OK", seconds, len(members))
        self._learn(model.figures, seconds)
        errors = member_errors(reply.parameters, len(members))
        blamed = {index: model.blame(error) for index, error in errors.items()}
        return Reply(outputs, reply.model_version, blamed, request, reply)

    def spare(self, model: Model, client: str, route: Route) -> bool:
        """Whether another arm of `model` could take `client`'s call, should `route` hang."""
        return model.router.fallback(client, route, self._usable) is not None

    def usual(self, figures: str) -> float:
        """The usual seconds of a call of the model counted under `figures` (0 before any)."""
        return self._usual.get(figures, 0.0)

    def after(
        self,
        model: Model,
        members: list[Member],
        errors: dict[int, StrataError],
        moving_from: Route | None,
    ) -> Next:
        """Where members (`errors`: each one's, by index) that `model` failed go next: to
        another of its arms where theirs was unavailable and they may still leave it
        (`moving_from`, else None), to its fallback where that answers for their error;
        the others fail with it here."""
        after = Next()
        for index, error in errors.items():
            member = members[index]
            other = None
            if moving_from is not None and isinstance(error, Unavailable):
                other = model.router.fallback(member.request.client, moving_from, self._usable)
            if other is not None:
                after.moved.setdefault(other.arm, (other, []))[1].append(index)
            elif model.has_fallback and answers_for(error):
                after.fallback.append(index)
            else:
                member.fail(error)
        if moving_from is not None:
            pipeline = model.router.pipeline
            for route, indices in after.moved.values():
                FAILOVERS.labels(pipeline, moving_from.arm, route.arm).inc(len(indices))
        return after

    def _learn(self, figures: str, seconds: float) -> None:
        before = self._usual.get(figures)
        self._usual[figures] = (
            seconds if before is None else before + SMOOTHING * (seconds - before)
        )


def model_request(
    model: str, version: str, members: list[Member], rows: list[int], features: list[v1.Tensor]
) -> v2.ModelInferRequest:
    """A v2 ModelInfer of `model` over the stacked rows (`rows` of each member); for several
    members, each one's rows, trace context and deadline in the parameters (another v2
    server just sees a batch)."""
    first = members[0].request
    request = v2.ModelInferRequest(model_name=model, model_version=version, id=first.request_id)
    for tensor in features:
        entry = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if tensor.slab:  # preprocess's blocks, passed on (upstream/slabs.py)
            entry.parameters[ASK].string_param = tensor.slab
        request.raw_input_contents.append(tensor.data)
    parameters = request.parameters
    if first.level >= 2:
        parameters["skip_batching"].bool_param = True
    if first.sequence is not None:
        add_parameters(parameters, first.sequence)
    if len(members) > 1:
        set_members(parameters, [_flight_member(m, n) for m, n in zip(members, rows, strict=True)])
    return request


def _flight_member(member: Member, rows: int) -> FlightMember:
    """`member` as a flight request declares it, carrying `rows` rows there."""
    return FlightMember(rows, member.carrier().get("traceparent", ""), member.deadline)
