"""One flight through the chain: preprocess, inference on its arm, postprocess.

Every hop is one call for the whole flight. Tensors go from one layer to the next as the
bytes the last one returned; only the final answer is decoded, once, and split by rows.
Each member keeps its own outcome: a member a layer refused gets that layer's error and
leaves, and a member whose caller gave up or whose deadline passed is cut out of the stack
before the next hop. When an arm is unavailable, the flight moves to each member's
fallback arm (A/B stickiness decides which), unless its arm was forced. Members the first
model cannot answer at all (no arm left, or an error its fallback covers) go to the
pipeline's fallback model where it has one (services/gateway/flow/model_stages.py), as do all of
them from that fallback's degradation level. Each answered flight's hop times go to the
pipeline's statistics (services/gateway/flow/statistics.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from itertools import accumulate

from services.gateway.flow.flights import Member
from services.gateway.flow.model_stages import Staged, Stages, covers, stands_in
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
# A flight's preprocess seconds, and when its inference began (time.monotonic()).
HopStarts = tuple[float, float]
# Members the first model failed with an error its fallback covers, and their features.
Unanswered = tuple[list[Member], WireTensors]


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
        """Answer every member of the flight (their futures), or raise for all of them."""
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
            return
        if members:
            self._saw(members, features)
            spent = time.monotonic() - started
            await self._onward(first.route, members, features, True, spent)

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

    async def _onward(
        self,
        route: Route,
        members: list[Member],
        features: WireTensors,
        may_fail_over: bool,
        preprocess_seconds: float,
    ) -> None:
        """From inference on `route` (or the first model's fallback) to the answers."""
        first = _request(members[0])
        times = (preprocess_seconds, time.monotonic())
        if stands_in(first.pipeline, first.level) and not first.forced_arm:
            await self._stand_in(route, members, features, times)
            return
        try:
            spare = may_fail_over and self._spare(first, route)
            members, features, scores, version, unanswered = await self._infer(
                route, members, features, spare
            )
        except StrataError as exc:
            if isinstance(exc, Unavailable) and may_fail_over and not first.forced_arm:
                await self._fail_over(route, members, features, exc, times)
            elif self._covered(first, exc):
                await self._stand_in(route, members, features, times)
            else:
                raise
            return
        moves = [
            _answering(
                members, self._onward_from_model(route, members, features, scores, version, times)
            )
        ]
        if unanswered[0]:  # the usual case has no group for the fallback
            moves.append(_answering(unanswered[0], self._stand_in(route, *unanswered, times)))
        await gathering.gather(moves)  # each group's failure is its own

    async def _onward_from_model(
        self,
        route: Route,
        members: list[Member],
        features: WireTensors,
        scores: WireTensors,
        version: str,
        times: HopStarts,
    ) -> None:
        """From the first model's answers (`scores`) to the members' answers."""
        if not members:
            return
        first = _request(members[0])
        self._mirror(members, features, scores)
        staged = None
        if first.pipeline.stages:
            staged = await self._stages.run(members, features, scores, first.pipeline.model.name)
            members, features, scores = staged.members, staged.features, staged.given
        await self._postprocess(route.arm, version, members, features, scores, staged, times)

    async def _stand_in(
        self, route: Route, members: list[Member], features: WireTensors, times: HopStarts
    ) -> None:
        """Members answered by their pipeline's first model's fallback in that model's place
        (their answers marked degraded, with no model version: the model did not answer)."""
        if not members:
            return
        staged = await self._stages.stand_in(members, features)
        members, features, scores = staged.members, staged.features, staged.given
        await self._postprocess(route.arm, "", members, features, scores, staged, times)

    def _covered(self, first: ClientRequest, exc: StrataError) -> bool:
        """Whether the first model's fallback answers in its place after `exc` (never for a
        request that forced its arm: it asked for that arm's answer)."""
        return covers(first.pipeline, exc) and not first.forced_arm

    async def _postprocess(
        self,
        arm: str,
        version: str,
        members: list[Member],
        features: WireTensors,
        scores: WireTensors,
        staged: Staged | None,
        times: HopStarts,
    ) -> None:
        """Postprocess over what the models gave, then each member's answer."""
        if not members:
            return
        first = _request(members[0])
        preprocess_seconds, started = times
        inferred = time.monotonic()
        flags = {**first.parameters, "core_only": "true" if first.level >= 1 else "false"}
        tensors = [*scores, *_forwarded(first, features)]
        self._saw(members, tensors)
        members, outputs, info = await self._layer(self._up.postprocess, members, tensors, flags)
        if members:
            self._saw(members, outputs)
            skipped = info.get("skipped_rules", "")
            answered = _answer(members, outputs, arm, version, skipped, staged)
            hops = Hops(preprocess_seconds, inferred - started, time.monotonic() - inferred)
            STATISTICS.flew(first.pipeline_name, answered, hops, version)

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
                item.members.add(
                    id=_request(member).request_id,
                    rows=member.rows,
                    trace_context=member.carrier(),
                )
        reply = await hop.call("Process", v1.ProcessRequest(requests=[item]), _deadline(members))
        if len(reply.results) != 1:
            raise RuntimeError(f"{hop.name} answered {len(reply.results)} results for 1 request")
        result = reply.results[0]
        return _survivors(members, result), list(result.tensors), dict(result.info)

    async def _infer(
        self, route: Route, members: list[Member], features: WireTensors, spare: bool
    ) -> tuple[list[Member], WireTensors, WireTensors, str, Unanswered]:
        """One ModelInfer over the flight's rows on `route`'s deployment; `spare`: whether
        another arm could take them, should this one hang. Also the members it failed with
        an error the first model's fallback covers, with their features."""
        members, features = _aboard(members, features)
        if not members:
            return [], features, [], "", ([], [])
        first = _request(members[0])
        model = first.pipeline.model
        rows = [m.rows for m in members]
        version = route.version or model.version
        request = model_request(model.name, version, members, rows, features)
        hop = self._up.inference_hop(route.deployment, first.sequence)
        started = time.monotonic()
        try:
            reply = await hop.call("ModelInfer", request, _deadline(members), spare=spare)
        except StrataError as exc:
            self._record(members, route, exc.code.name, 0.0)
            raise
        try:
            scores = codec.response_tensors(reply, f"inference deployment {route.deployment!r}")
        except StrataError as exc:
            self._record(members, route, exc.code.name, time.monotonic() - started)
            raise
        self._record(members, route, "OK", time.monotonic() - started)
        errors = member_errors(reply.parameters, len(members))
        unanswered: Unanswered = ([], [])
        if errors:
            rows = [m.rows for m in members]
            kept = [i for i in range(len(members)) if i not in errors]
            covered = [i for i, error in errors.items() if self._covered(first, error)]
            unanswered = ([members[i] for i in covered], stack.take(features, rows, covered))
            features = stack.take(features, rows, kept)
            for index, error in errors.items():
                if index not in covered:
                    _fail(members[index], error)
            members = [members[i] for i in kept]
        if members:
            self._saw(members, scores)
        return members, features, scores, reply.model_version, unanswered

    def _spare(self, first: ClientRequest, route: Route) -> bool:
        """Whether another arm could take the flight, should `route`'s hang."""
        if first.forced_arm:
            return False
        router = self._routers[first.pipeline_name]
        return router.fallback(first.client, route, self._usable) is not None

    def _record(self, members: list[Member], route: Route, code: str, seconds: float) -> None:
        name = _request(members[0]).pipeline_name
        self._arms.record(name, route.arm, code, seconds, len(members))

    async def _fail_over(
        self,
        failed: Route,
        members: list[Member],
        features: WireTensors,
        exc: Unavailable,
        times: HopStarts,
    ) -> None:
        """Each member on its fallback arm (one inference call per arm); where none is left,
        on the pipeline's fallback model if it has one, else the error."""
        first = _request(members[0])
        router = self._routers[first.pipeline_name]
        by_arm: dict[str, tuple[Route, list[int]]] = {}
        stranded = []
        for index, member in enumerate(members):
            other = router.fallback(_request(member).client, failed, self._usable)
            if other is not None:
                by_arm.setdefault(other.arm, (other, []))[1].append(index)
            elif self._covered(first, exc):
                stranded.append(index)
            else:
                _fail(member, exc)
        rows = [m.rows for m in members]
        group = [members[i] for i in stranded]
        standing = self._stand_in(failed, group, stack.take(features, rows, stranded), times)
        moves = [_answering(group, standing)]
        for route, indices in by_arm.values():
            FAILOVERS.labels(router.pipeline, failed.arm, route.arm).inc(len(indices))
            group = [members[i] for i in indices]
            taken = stack.take(features, rows, indices)
            moved = self._onward(route, group, taken, False, times[0])
            moves.append(_answering(group, moved))
        await gathering.gather(moves)

    def _mirror(self, members: list[Member], features: WireTensors, scores: WireTensors) -> None:
        """Submit the members the pipeline's shadow route mirrors (decoded: rare and off the
        answer's path)."""
        first = _request(members[0])
        router = self._routers[first.pipeline_name]
        mirrored = [
            i
            for i, m in enumerate(members)
            if router.mirrors(_request(m).request_id or _request(m).client)
        ]
        if not mirrored:
            return
        inputs = _split(codec.tensors_to_arrays(features), [m.rows for m in members])
        outputs = _split(codec.tensors_to_arrays(scores), [m.rows for m in members])
        for i in mirrored:
            request = _request(members[i])
            self._shadow.submit(
                first.pipeline_name, first.pipeline.model, inputs[i], outputs[i], request.deadline
            )


def _request(member: Member) -> ClientRequest:
    return member.request


async def _answering(members: list[Member], work) -> None:
    """Run `work` for `members`; if it fails, they fail with it, and no one else."""
    try:
        await work
    except Exception as exc:
        for member in members:
            _fail(member, exc)


def _fail(member: Member, exc: BaseException) -> None:
    if member.waiting:
        member.future.set_exception(exc)


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
            _fail(members[0], from_code(result.error.code, result.error.message))
            return []
        return members
    if len(result.members) != len(members):
        raise RuntimeError(f"a layer answered {len(result.members)} of {len(members)} members")
    kept = []
    for member, outcome in zip(members, result.members, strict=True):
        if outcome.HasField("error"):
            _fail(member, from_code(outcome.error.code, outcome.error.message))
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
    members: list[Member],
    outputs: WireTensors,
    arm: str,
    version: str,
    skipped: str,
    staged: Staged | None,
) -> int:
    """Decode the flight's answer once and give each member its rows; how many got it."""
    level = _request(members[0]).level
    answered = 0
    for member, arrays in zip(
        members, _split(codec.tensors_to_arrays(outputs), [m.rows for m in members]), strict=True
    ):
        if member.waiting:
            answer = Answer(arrays, arm, version, level, skipped_rules=skipped)
            if staged is not None:
                answer.stages = ",".join(staged.answered[member])
                answer.degraded = staged.degraded.get(member, "")
            member.future.set_result(answer)
            answered += 1
    return answered


def _split(arrays: codec.Arrays, rows: Sequence[int]) -> list[codec.Arrays]:
    """Each member's rows of stacked `arrays` (views, no copies)."""
    if len(rows) == 1:
        return [arrays]
    bounds = [0, *accumulate(rows)]
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != bounds[-1]:
            raise RuntimeError(
                f"output {name!r} of shape {list(array.shape)} is not stacked over "
                f"{bounds[-1]} rows"
            )
    return [
        {name: array[bounds[i] : bounds[i + 1]] for name, array in arrays.items()}
        for i in range(len(rows))
    ]
