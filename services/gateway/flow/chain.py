"""One flight through the chain: preprocess, inference on its arm, postprocess.

Every hop is one call for the whole flight. Tensors go from one layer to the next as the
bytes the last one returned; only the final answer is decoded, once, and split by rows.
Each member keeps its own outcome: a member a layer refused gets that layer's error and
leaves, and a member whose caller gave up or whose deadline passed is cut out of the stack
before the next hop. When an arm is unavailable, the flight moves to each member's
fallback arm (A/B stickiness decides which), unless its arm was forced. Members the first
model cannot answer at all (no arm left, or an error its fallback covers) go to the
pipeline's fallback model where it has one (services/gateway/flow/fallback.py), as do all of
them from that fallback's degradation level. Each answered flight's hop times go to the
pipeline's statistics (services/gateway/flow/statistics.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from services.gateway.flow import blame
from services.gateway.flow.fallback import covers, stands_in
from services.gateway.flow.flights import Member
from services.gateway.flow.mirror import mirror_first
from services.gateway.flow.model_stages import Staged, Stages
from services.gateway.flow.rows import split
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.flow.sizing import Sizes, arm_of, is_too_large, too_large
from services.gateway.flow.statistics import STATISTICS, Hops
from services.gateway.metrics import FAILOVERS
from services.gateway.request import Answer, ClientRequest
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from services.gateway.upstream.sequences import add_parameters
from services.gateway.upstream.upstreams import Hop, Upstreams
from strata import codec, gathering, stack
from strata.config.pipelines import Route
from strata.deadline import Deadline, latest
from strata.errors import StrataError, Unavailable, from_code
from strata.flight import FlightMember, member_errors, set_members
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1

# A flight's tensors as the hops carry them (strata.v1 raw bytes), not decoded Arrays.
WireTensors = list[v1.Tensor]


@dataclass(frozen=True)
class Leg:
    """Members that travel on together: their rows of preprocess's outputs (`features`), the
    arm they are on, and the flight's times so far (preprocess's seconds, and when its
    inference began, time.monotonic())."""

    members: list[Member]
    features: WireTensors
    route: Route
    preprocess_seconds: float
    started: float = 0.0

    @property
    def first(self) -> ClientRequest:
        return _request(self.members[0])

    def part(self, indices: list[int], route: Route | None = None) -> Leg:
        """Members `indices` of the leg with their rows, on `route` (else the leg's)."""
        rows = [m.rows for m in self.members]
        return replace(
            self,
            members=[self.members[i] for i in indices],
            features=stack.take(self.features, rows, indices),
            route=route or self.route,
        )


@dataclass(frozen=True)
class Given:
    """What the models gave a leg: their tensors, the first model's version ("" where its
    fallback answered), and which stages answered each member (None without stages)."""

    scores: WireTensors
    version: str
    staged: Staged | None = None


class Chain:
    """Carries flights through the upstreams."""

    def __init__(
        self,
        upstreams: Upstreams,
        routers: dict[str, Router],
        shadow: ShadowRunner,
        arms: ArmBook,
        usable: Callable[[Route], bool],
        stages: Stages,
        sizes: Sizes,
    ) -> None:
        self._up = upstreams
        self._sizes = sizes
        self._stages = stages
        self._routers = routers
        self._shadow = shadow
        self._arms = arms
        self._usable = usable

    async def fly(self, members: list[Member]) -> None:
        """Answer every member of the flight (their futures), or raise for all of them:
        preprocess, then the model (failing over to another arm, or to its fallback), then
        the later stages and postprocess."""
        leg = await self._preprocess(members)
        if leg is not None:
            await self._model(leg, may_fail_over=True)

    async def _preprocess(self, members: list[Member]) -> Leg | None:
        """Preprocess over the flight: the leg it starts, None where no member is left or
        the flight flew again as two (its answer too large)."""
        first = _request(members[0])
        tensors = stack.join([_request(m).inputs for m in members])
        started = time.monotonic()
        # The version the arm calls picks the steps of a pipeline fed per model version.
        flags = {"model_version": first.version} if first.version else {}
        try:
            members, features, _ = await self._layer(self._up.preprocess, members, tensors, flags)
        except StrataError as exc:
            if not is_too_large(exc):
                raise
            await self._split(members)
            return None
        if not members:
            return None
        self._saw(members, features)
        return Leg(members, features, first.route, time.monotonic() - started)

    async def _model(self, leg: Leg, may_fail_over: bool) -> None:
        """The first model on the leg's arm, then onward: where that arm is unavailable, the
        members fail over to their other arms; where the model cannot answer them, its
        fallback answers in its place."""
        leg = replace(leg, started=time.monotonic())
        first = leg.first
        if stands_in(first.pipeline, first.level) and not first.forced_arm:
            await self._fallback(leg)
            return
        try:
            answered, given, unanswered = await self._infer(leg, may_fail_over and self._spare(leg))
        except StrataError as exc:
            if isinstance(exc, Unavailable) and may_fail_over and not first.forced_arm:
                await self._fail_over(leg, exc)
            elif self._covered(first, exc):
                await self._fallback(leg)
            else:
                raise
            return
        moves = [_answering(answered.members, self._onward(answered, given))]
        if unanswered.members:  # the usual case has no group for the fallback
            moves.append(_answering(unanswered.members, self._fallback(unanswered)))
        await gathering.gather(moves)  # each group's failure is its own

    async def _fail_over(self, leg: Leg, exc: Unavailable) -> None:
        """Each member on its fallback arm (one inference call per arm); where none is left,
        on the pipeline's fallback model if it has one, else the error."""
        first, failed = leg.first, leg.route
        router = self._routers[first.pipeline_name]
        by_arm: dict[str, tuple[Route, list[int]]] = {}
        stranded = []
        for index, member in enumerate(leg.members):
            other = router.fallback(_request(member).client, failed, self._usable)
            if other is not None:
                by_arm.setdefault(other.arm, (other, []))[1].append(index)
            elif self._covered(first, exc):
                stranded.append(index)
            else:
                member.fail(exc)
        left = leg.part(stranded)
        moves = [_answering(left.members, self._fallback(left))]
        for route, indices in by_arm.values():
            FAILOVERS.labels(router.pipeline, failed.arm, route.arm).inc(len(indices))
            moved = leg.part(indices, route)
            moves.append(_answering(moved.members, self._model(moved, may_fail_over=False)))
        await gathering.gather(moves)

    async def _fallback(self, leg: Leg) -> None:
        """Members answered by their pipeline's first model's fallback in that model's place
        (their answers marked degraded, with no model version: the model did not answer),
        then by the later stages and postprocess."""
        if not leg.members:
            return
        staged = await self._stages.stand_in(leg.members, leg.features)
        after = replace(leg, members=staged.members, features=staged.features)
        await self._postprocess(after, Given(staged.given, "", staged))

    async def _onward(self, leg: Leg, given: Given) -> None:
        """From the first model's answers through the later stages and postprocess."""
        if not leg.members:
            return
        first = leg.first
        router = self._routers[first.pipeline_name]
        mirror_first(self._shadow, router, leg.members, leg.features, given.scores)
        if first.pipeline.stages:
            model = first.pipeline.model.name
            staged = await self._stages.run(leg.members, leg.features, given.scores, model)
            leg = replace(leg, members=staged.members, features=staged.features)
            given = Given(staged.given, given.version, staged)
        await self._postprocess(leg, given)

    async def _postprocess(self, leg: Leg, given: Given) -> None:
        """Postprocess over what the models gave, then each member's answer."""
        if not leg.members:
            return
        first = leg.first
        inferred = time.monotonic()
        flags = {**first.parameters, "core_only": "true" if first.level >= 1 else "false"}
        tensors = [*given.scores, *_forwarded(first, leg.features)]
        self._saw(leg.members, tensors)
        post = self._up.postprocess
        members, outputs, info = await self._layer(post, leg.members, tensors, flags)
        if members:
            self._saw(members, outputs)
            skipped = info.get("skipped_rules", "")
            answered = _answer(members, outputs, leg.route.arm, given, skipped)
            inference_seconds = inferred - leg.started
            hops = Hops(leg.preprocess_seconds, inference_seconds, time.monotonic() - inferred)
            STATISTICS.flew(first.pipeline_name, answered, hops, given.version)

    async def _split(self, members: list[Member]) -> None:
        """A flight whose preprocess answer passed the message limit (its rows larger than
        recent ones) flies again as two; a request alone that does is refused."""
        rows = sum(m.rows for m in members)
        if len(members) == 1:
            raise too_large(rows, None, self._up.message_limit)
        self._sizes.overflowed(arm_of(_request(members[0])), rows)
        half = len(members) // 2
        await gathering.gather(
            [_answering(part, self.fly(part)) for part in (members[:half], members[half:])]
        )

    def _saw(self, members: list[Member], tensors: WireTensors) -> None:
        """A message of the flight's, between two layers, for its size per row."""
        size = sum(len(t.data) for t in tensors)
        self._sizes.saw(arm_of(_request(members[0])), sum(m.rows for m in members), size)

    def _covered(self, first: ClientRequest, exc: StrataError) -> bool:
        """Whether the first model's fallback answers in its place after `exc` (never for a
        request that forced its arm: it asked for that arm's answer)."""
        return covers(first.pipeline, exc) and not first.forced_arm

    async def _layer(
        self, hop: Hop, members: list[Member], tensors: WireTensors, flags: dict[str, str]
    ) -> tuple[list[Member], WireTensors, dict[str, str]]:
        """One strata.v1 Process call for the flight: who is left, their tensors, the info."""
        members, tensors = _aboard(members, tensors)
        if not members:
            return [], [], {}
        first = _request(members[0])
        item = v1.Request(
            id=first.request_id, pipeline=first.pipeline_name, tensors=tensors, parameters=flags
        )
        if len(members) > 1:
            for member in members:
                # Field by field: add()'s keywords, a map among them, cost 2.4 times as much.
                entry = item.members.add()
                entry.id = _request(member).request_id
                entry.rows = member.rows
                for key, value in member.carrier().items():
                    entry.trace_context[key] = value
        reply = await hop.call("Process", v1.ProcessRequest(requests=[item]), _deadline(members))
        if len(reply.results) != 1:
            raise RuntimeError(f"{hop.name} answered {len(reply.results)} results for 1 request")
        result = reply.results[0]
        return _survivors(members, result), list(result.tensors), dict(result.info)

    async def _infer(self, leg: Leg, spare: bool) -> tuple[Leg, Given, Leg]:
        """One ModelInfer over the leg's rows on its arm's deployment; `spare`: whether
        another arm could take them, should this one hang. The members it answered and what
        it gave them, and those it failed with an error the first model's fallback covers."""
        members, features = _aboard(leg.members, leg.features)
        leg = replace(leg, members=members, features=features)
        if not members:
            return leg, Given([], ""), leg
        first, route = leg.first, leg.route
        model = first.pipeline.model
        version = route.version or model.version
        request = model_request(model.name, version, members, [m.rows for m in members], features)
        hop = self._up.inference_hop(route.deployment, first.sequence)
        started = time.monotonic()
        try:
            reply = await hop.call("ModelInfer", request, _deadline(members), spare=spare)
        except StrataError as exc:
            self._record(members, route, exc.code.name, 0.0)
            raise blame.first_model(first.pipeline_name, first.pipeline, exc) from None
        try:
            scores = codec.response_tensors(reply, f"inference deployment {route.deployment!r}")
        except StrataError as exc:
            self._record(members, route, exc.code.name, time.monotonic() - started)
            raise
        self._record(members, route, "OK", time.monotonic() - started)
        errors = member_errors(reply.parameters, len(members))
        errors = {
            i: blame.first_model(first.pipeline_name, first.pipeline, e) for i, e in errors.items()
        }
        answered, unanswered = self._apart(leg, errors)
        if answered.members:
            self._saw(answered.members, scores)
        return answered, Given(scores, reply.model_version), unanswered

    def _apart(self, leg: Leg, errors: dict[int, StrataError]) -> tuple[Leg, Leg]:
        """The leg's members the model answered, and those it failed with an error its
        fallback covers; the others fail with their error."""
        if not errors:  # the usual call: no stack to cut
            return leg, replace(leg, members=[], features=[])
        kept = [i for i in range(len(leg.members)) if i not in errors]
        covered = [i for i, error in errors.items() if self._covered(leg.first, error)]
        for index, error in errors.items():
            if index not in covered:
                leg.members[index].fail(error)
        return leg.part(kept), leg.part(covered)

    def _spare(self, leg: Leg) -> bool:
        """Whether another arm could take the leg, should its own hang."""
        first = leg.first
        if first.forced_arm:
            return False
        router = self._routers[first.pipeline_name]
        return router.fallback(first.client, leg.route, self._usable) is not None

    def _record(self, members: list[Member], route: Route, code: str, seconds: float) -> None:
        name = _request(members[0]).pipeline_name
        self._arms.record(name, route.arm, code, seconds, len(members))


def _request(member: Member) -> ClientRequest:
    return member.request


async def _answering(members: list[Member], work) -> None:
    """Run `work` for `members`; if it fails, they fail with it, and no one else."""
    try:
        await work
    except Exception as exc:
        for member in members:
            member.fail(exc)


def _aboard(members: list[Member], tensors: WireTensors) -> tuple[list[Member], WireTensors]:
    """The members whose callers still wait, and their rows of `tensors`."""
    kept = [i for i, member in enumerate(members) if member.waiting]
    if len(kept) == len(members):
        return members, tensors
    if not kept:
        return [], []
    rows = [m.rows for m in members]
    return [members[i] for i in kept], stack.take(tensors, rows, kept)


def _deadline(members: list[Member]) -> Deadline:
    """The last of the members' deadlines: the hop's call must not outlive it."""
    return latest(m.deadline for m in members)


def _survivors(members: list[Member], result: v1.Result) -> list[Member]:
    """The members a layer answered; the others get their own error."""
    if not result.members:
        if result.HasField("error"):
            members[0].fail(from_code(result.error.code, result.error.message))
            return []
        return members
    if len(result.members) != len(members):
        raise RuntimeError(f"a layer answered {len(result.members)} of {len(members)} members")
    kept = []
    for member, outcome in zip(members, result.members, strict=True):
        if outcome.HasField("error"):
            member.fail(from_code(outcome.error.code, outcome.error.message))
        else:
            member.rows = outcome.rows
            kept.append(member)
    return kept


def model_request(
    model: str, version: str, members: list[Member], rows: list[int], features: WireTensors
) -> v2.ModelInferRequest:
    """A v2 ModelInfer of `model` over the stacked rows (`rows` of each member); for several
    members, each one's rows, trace context and deadline in the parameters (another v2
    server just sees a batch)."""
    first = _request(members[0])
    request = v2.ModelInferRequest(model_name=model, model_version=version, id=first.request_id)
    for tensor in features:
        request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
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


def _forwarded(first: ClientRequest, features: WireTensors) -> WireTensors:
    """The preprocess outputs the pipeline passes on to postprocess."""
    wanted = first.pipeline.forward_to_postprocess
    forwarded = [t for t in features if t.name in wanted]
    if len(forwarded) != len(wanted):
        missing = sorted(set(wanted) - {t.name for t in forwarded})
        raise RuntimeError(f"forward_to_postprocess names {missing}, not preprocess outputs")
    return forwarded


def _answer(
    members: list[Member], outputs: WireTensors, arm: str, given: Given, skipped: str
) -> int:
    """Decode the flight's answer once and give each member its rows; how many got it."""
    level = _request(members[0]).level
    staged = given.staged
    answered = 0
    for member, arrays in zip(
        members, split(codec.tensors_to_arrays(outputs), [m.rows for m in members]), strict=True
    ):
        if member.waiting:
            answer = Answer(arrays, arm, given.version, level, skipped_rules=skipped)
            if staged is not None:
                answer.stages = ",".join(staged.answered[member])
                answer.degraded = staged.degraded.get(member, "")
            member.future.set_result(answer)
            answered += 1
    return answered
