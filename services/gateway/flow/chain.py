"""One flight through the chain: preprocess, inference on its arm, postprocess.

Every hop is one call for the whole flight. Tensors go from one layer to the next as the
bytes the last one returned; only the final answer is decoded, once, and split by rows.
Preprocess's crops that came by ref through its shared-memory slab go on to the first model
by ref (upstream/slabs.py's Passed); whatever reads them instead (a member's rows, a stage, a
shadow, a fallback, postprocess) reads their bytes first, and the flight gives the blocks
back when it is done.
Each member keeps its own outcome: a member a layer refused gets that layer's error and
leaves, and a member whose caller gave up or whose deadline passed is cut out of the stack
before the next hop. The first model is called as every model of a flight is
(services/gateway/flow/model_calls.py): when its arm is unavailable, the flight moves to each
member's fallback arm (A/B stickiness decides which), unless its arm was forced; members it
cannot answer at all (no arm left, or an error its fallback answers for) go to the
pipeline's fallback model where it has one (services/gateway/flow/fallback.py), as do all of
them from that fallback's degradation level. Each answered flight's hop times go to the
pipeline's statistics (services/gateway/flow/statistics.py).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from services.gateway.flow import blame
from services.gateway.flow.fallback import stands_in
from services.gateway.flow.flights import Member
from services.gateway.flow.mirror import mirror_first
from services.gateway.flow.model_calls import Model, ModelCalls
from services.gateway.flow.model_stages import Staged, Stages
from services.gateway.flow.rows import split
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.flow.sizing import Sizes, arm_of, is_too_large, too_large
from services.gateway.flow.statistics import STATISTICS, Hops
from services.gateway.request import Answer, ClientRequest
from services.gateway.upstream.router import Router
from services.gateway.upstream.upstreams import ProcessHop, Upstreams
from strata.calls import gathering
from strata.config.pipelines import Route
from strata.errors import StrataError, from_code
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec, stack
from strata.wire.deadline import Deadline, latest

# A flight's tensors as the hops carry them (strata.v1 raw bytes), not decoded Arrays.
WireTensors = list[v1.Tensor]
Tensors = RepeatedCompositeFieldContainer[v1.Tensor]  # a message's


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
        calls: ModelCalls,
        stages: Stages,
        sizes: Sizes,
    ) -> None:
        self._up = upstreams
        self._sizes = sizes
        self._stages = stages
        self._routers = routers
        self._shadow = shadow
        self._calls = calls
        self._passed = upstreams.passed

    async def fly(self, members: list[Member]) -> None:
        """Answer every member of the flight (their futures), or raise for all of them:
        preprocess, then the model (failing over to another arm, or to its fallback), then
        the later stages and postprocess."""
        leg = await self._preprocess(members)
        if leg is None:
            return
        try:
            await self._model(leg, may_fail_over=True)
        finally:
            self._release(leg.features)

    async def _preprocess(self, members: list[Member]) -> Leg | None:
        """Preprocess over the flight: the leg it starts, None where no member is left or
        the flight flew again as two (its answer too large)."""
        first = _request(members[0])
        route = first.route
        if route is None:
            raise RuntimeError("a request boarded a flight before its arm was chosen")
        members = [m for m in members if m.waiting]
        if not members:
            return None
        inputs = [_request(m).inputs for m in members]
        started = time.monotonic()
        # The version the arm calls picks the steps of a pipeline fed per model version.
        flags = {"model_version": first.version} if first.version else {}
        stacked = functools.partial(stack.join, inputs)
        try:
            members, features, _ = await self._layer(self._up.preprocess, members, stacked, flags)
        except StrataError as exc:
            if not is_too_large(exc):
                raise
            await self._split(members)
            return None
        if not members:
            self._release(features)
            return None
        self._saw(members, features)
        return Leg(members, features, route, time.monotonic() - started)

    def _bytes(self, leg: Leg) -> Leg:
        """`leg` with its features' bytes in hand, for what reads them rather than passes
        them on by ref (a member's rows, a stage, a shadow, a fallback, postprocess)."""
        if self._passed is None:
            return leg
        return replace(leg, features=self._passed.read(leg.features))

    def _release(self, features: WireTensors) -> None:
        """Give back the slab blocks preprocess's answer named: the flight is done with them."""
        if self._passed is not None:
            self._passed.release(features)

    async def _model(self, leg: Leg, may_fail_over: bool) -> None:
        """The first model on the leg's arm, then onward: where that arm is unavailable, the
        members fail over to their other arms; where the model cannot answer them, its
        fallback answers in its place (model_calls.py decides which)."""
        leg = replace(leg, started=time.monotonic())
        first = leg.first
        if stands_in(first.pipeline, first.level) and not first.forced_arm:
            await self._fallback(self._bytes(leg))
            return
        if not all(member.waiting for member in leg.members):
            leg = self._bytes(leg)  # the rows of those who wait are cut out
        members, features = _aboard(leg.members, leg.features)
        if not members:
            return
        leg = replace(leg, members=members, features=features)
        model = self._first_model(first)
        moving_from = leg.route if may_fail_over and not first.forced_arm else None
        spare = moving_from is not None and self._calls.spare(model, first.client, leg.route)
        rows = [m.rows for m in members]
        try:
            reply = await self._calls.call(model, leg.route, members, rows, features, spare=spare)
        except StrataError as exc:
            errors = dict.fromkeys(range(len(members)), exc)
            await self._after(self._bytes(leg), model, errors, moving_from)
            return
        answered = leg
        if reply.errors:  # the usual call has none: no stack to cut
            leg = self._bytes(leg)
            answered = leg.part([i for i in range(len(members)) if i not in reply.errors])
        if answered.members:
            self._saw(answered.members, reply.outputs)
        given = Given(reply.outputs, reply.version)
        moves = [_answering(answered.members, self._onward(answered, given))]
        if reply.errors:
            failed = [members[i] for i in reply.errors]
            moves.append(_answering(failed, self._after(leg, model, reply.errors, None)))
        await gathering.gather(moves)  # each group's failure is its own

    async def _after(
        self, leg: Leg, model: Model, errors: dict[int, StrataError], moving_from: Route | None
    ) -> None:
        """The leg's members the first model failed (`errors`, by index): each on another
        arm, on the model's fallback, or failed with its error."""
        after = self._calls.after(model, leg.members, errors, moving_from)
        left = leg.part(after.fallback)
        moves = [_answering(left.members, self._fallback(left))]
        for route, indices in after.moved.values():
            moved = leg.part(indices, route)
            moves.append(_answering(moved.members, self._model(moved, may_fail_over=False)))
        await gathering.gather(moves)

    def _first_model(self, first: ClientRequest) -> Model:
        """The pipeline's first model as `first`'s flight calls it (its fallback never
        answers a request that forced its arm: it asked for that arm's answer)."""
        pipeline = first.pipeline
        return Model(
            first.pipeline_name,
            pipeline.model,
            self._routers[first.pipeline_name],
            functools.partial(blame.first_model, first.pipeline_name, pipeline),
            pipeline.fallback is not None and not first.forced_arm,
        )

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
        pipeline = first.pipeline
        if router.shadow or pipeline.stages or pipeline.forward_to_postprocess:
            leg = self._bytes(leg)
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
        members, tensors = _aboard(leg.members, [*given.scores, *_forwarded(first, leg.features)])
        if not members:
            return
        self._saw(members, tensors)
        post = self._up.postprocess
        members, outputs, info = await self._layer(post, members, _adding(tensors), flags)
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
        size = sum(stack.tensor_size(t) for t in tensors)
        self._sizes.saw(arm_of(_request(members[0])), sum(m.rows for m in members), size)

    async def _layer(
        self,
        hop: ProcessHop,
        members: list[Member],
        stacked: Callable[[Tensors], None],
        flags: dict[str, str],
    ) -> tuple[list[Member], WireTensors, dict[str, str]]:
        """One strata.v1 Process call for the flight's `members` (all aboard), over the
        tensors `stacked` adds: who is left, their tensors, the info."""
        first = _request(members[0])
        # Built in place: ProcessRequest(requests=[item]) copied a flight of photos' 3 MB item
        # in 3.6 ms, where extending the item's tensors in place copies them in 0.7, and
        # adding them made there (stack.join) once.
        request = v1.ProcessRequest()
        item = request.requests.add()
        item.id, item.pipeline = first.request_id, first.pipeline_name
        stacked(item.tensors)
        item.parameters.update(flags)
        if len(members) > 1:
            for member in members:
                # Field by field: add()'s keywords, a map among them, cost 2.4 times as much.
                entry = item.members.add()
                entry.id = _request(member).request_id
                entry.rows = member.rows
                for key, value in member.carrier().items():
                    entry.trace_context[key] = value
        reply = await hop.call("Process", request, _deadline(members))
        if len(reply.results) != 1:
            raise RuntimeError(f"{hop.name} answered {len(reply.results)} results for 1 request")
        result = reply.results[0]
        return _survivors(members, result), list(result.tensors), dict(result.info)


def _adding(tensors: WireTensors) -> Callable[[Tensors], None]:
    """What adds `tensors` to a message's (copied in once)."""
    return lambda into: into.extend(tensors)


def _request(member: Member) -> ClientRequest:
    return member.request


async def _answering(members: list[Member], work: Awaitable[None]) -> None:
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
