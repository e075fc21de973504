"""A pipeline's later model stages, run over a flight after its first model.

The flight's tensors (preprocess's outputs and the first model's) make one table of rows,
kept as the raw bytes they came in: a stage that runs for every row sends them on as they
are, and one that answers every row puts its reply's bytes in the table as they came. A
tensor is decoded only where a condition reads it or a stage takes or writes some of its
rows, and encoded again only if a stage wrote into it. Each stage takes the rows it runs for
(all of them, or those its condition picks, evaluated over the whole flight at once), calls
its model with just those rows, one ModelInfer per arm, and writes its outputs back into
their rows. A row a conditional stage passes over keeps what earlier stages gave it: a
cascade's early exit. Each member keeps its own error (a stage's error for one member fails
only that member), its own deadline (a stage is not started for a member whose budget is
shorter than the stage's usual time: it leaves with its earlier answer, marked degraded, or
fails where the stage was not optional) and its own trace (each stage is a span linked to
the members it carried). A stage with a fallback runs that cheaper model instead, for the
members its own could not answer (an arm unavailable, overloaded or failing, its circuit
open, the model not served there) and for all of them from the fallback's degradation level;
their answers are marked degraded. The pipeline's first model may have a fallback too: the
chain hands the members it could not answer (or all of them, from the fallback's level) to
`stand_in`, which runs the first model as a stage of its own fallback, then the later
stages. Every stage call counts in its arm's figures, under `<pipeline>/<stage>`. A stage's
shadow gets a copy of each mirrored member's rows its own model answered
(services/gateway/flow/shadow.py), counted under `<pipeline>/<stage>` too. What postprocess
receives is every tensor a model gave, for the members still waiting.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import Link

from services.gateway.flow.flights import Member
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from services.gateway.upstream.upstreams import Upstreams
from strata import codec, gathering, propagation, stack
from strata.config.pipelines import Condition, Fallback, ModelRef, Pipeline, Route, Stage
from strata.config.settings import Settings
from strata.deadline import latest
from strata.errors import DeadlineExceeded, NotReady, StrataError
from strata.flight import member_errors
from strata.limits import check_declared
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1

TRACER = trace.get_tracer("services.gateway")
# A degraded answer's source when a member left a cascade early because its budget was
# shorter than the next stage's usual time.
EARLY_EXIT = "early_exit"
# A degraded answer's source when a stage's fallback model answered it.
FALLBACK = "fallback"
FALLBACK_SUFFIX = "/fallback"  # a stage's label in strata.stages when its fallback answered
# How fast a stage's usual time follows its latest calls.
SMOOTHING = 0.2
# Failures of a stage's own model that its fallback answers instead: the server's, not the
# request's (a bad input or a deadline that passed is the same for any model).
FALLS_BACK = {
    "UNAVAILABLE",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "NOT_FOUND",
    "INTERNAL",
    "UNKNOWN",
}

StageKey = tuple[str, str]  # (pipeline, stage; "<stage>/fallback" for its fallback)
# Builds a ModelInfer request for a model and version over members' stacked tensors.
# (model, version, members, each member's rows in the call, the stacked inputs).
RequestBuilder = Callable[
    [str, str, list[Member], list[int], list[v1.Tensor]], v2.ModelInferRequest
]


def stage_routers(
    settings: Settings, serving: Callable[[str], Callable[[Route], bool]]
) -> dict[StageKey, Router]:
    """A router per later stage of every pipeline and per fallback (the first model's
    too), over its own arms, with the stage's shadow (a fallback has none)."""
    routers = {}
    for name, pipeline in settings.pipelines.items():
        for label, model in later_models(pipeline):
            routes = settings.model_routes(model)
            router = Router(f"{name}/{label}", routes, model.shadow, serving(model.name))
            routers[name, label] = router
    return routers


def later_models(pipeline: Pipeline) -> list[tuple[str, ModelRef]]:
    """The pipeline's models after its first, each by its label in strata.stages: the first
    model's fallback (`<model>/fallback`), then each later stage and its fallback."""
    models = []
    if pipeline.fallback is not None:
        models.append((pipeline.model.name + FALLBACK_SUFFIX, pipeline.fallback.model))
    for stage in pipeline.stages:
        models.append((stage.label, stage.model))
        if stage.fallback is not None:
            models.append((_fallback_label(stage), stage.fallback.model))
    return models


def covers(pipeline: Pipeline, exc: StrataError) -> bool:
    """Whether the pipeline's first model has a fallback that answers in its place when it
    failed with `exc`."""
    return pipeline.fallback is not None and exc.code.name in FALLS_BACK


def stands_in(pipeline: Pipeline, level: int) -> bool:
    """Whether the ladder's `level` sends a pipeline's requests to its first model's
    fallback before that model is tried."""
    return _at_level(pipeline.fallback, level)


@dataclass
class Staged:
    """A flight after its stages: the members still waiting, their rows of preprocess's
    outputs and of every tensor a model gave, which stages answered each one, and why an
    answer is degraded (EARLY_EXIT, FALLBACK), where it is."""

    members: list[Member]
    features: list[v1.Tensor]
    given: list[v1.Tensor]
    answered: dict[Member, list[str]]
    degraded: dict[Member, str] = field(default_factory=dict)


@dataclass
class _Table:
    """The flight's tensors stacked over every member's rows in boarding order: as raw
    bytes (`wire`) until a stage writes into them, and decoded (`arrays`) where a stage read
    or wrote them."""

    members: list[Member]
    wire: dict[str, v1.Tensor]
    given: list[str]
    answered: dict[Member, list[str]]
    degraded: dict[Member, str] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = [m.rows for m in self.members]
        self.starts = np.array([0, *accumulate(self.rows)])
        self.total = int(self.starts[-1])

    @functools.cached_property
    def owner(self) -> np.ndarray:
        """Each row's member (its index)."""
        return np.repeat(np.arange(len(self.rows)), self.rows)

    def kind(self, name: str) -> tuple[str, list[int]] | None:
        """Tensor `name`'s datatype and the shape of its rows; None where there is none."""
        tensor = self.wire.get(name)
        if tensor is not None:
            return tensor.datatype, list(tensor.shape[1:])
        array = self.arrays.get(name)
        if array is None:
            return None
        return codec.datatype_of(array), list(array.shape[1:])

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` decoded (a read-only view of the wire's bytes until written)."""
        array = self.arrays.get(name)
        if array is None:
            array = self.arrays[name] = codec.from_tensor(self.wire[name])
        return array

    def tensor(self, name: str) -> v1.Tensor:
        """Tensor `name` as strata.v1 bytes: as it came where no stage wrote into it."""
        tensor = self.wire.get(name)
        return tensor if tensor is not None else codec.to_tensor(name, self.arrays[name])

    def put(self, tensor: v1.Tensor) -> None:
        """`tensor` (every row) in place of what the table had of its name."""
        self.arrays.pop(tensor.name, None)
        self.wire[tensor.name] = tensor

    def inputs(self, stage: Stage, rows: np.ndarray) -> list[v1.Tensor]:
        """The stage's model inputs over `rows`: forwarded as they are where that is every
        row (the rows are ascending, so as many as the table has are all of them)."""
        if len(rows) == self.total:
            return [_named(self.tensor(source), name) for name, source in stage.inputs.items()]
        return [
            codec.to_tensor(name, self.array(source)[rows]) for name, source in stage.inputs.items()
        ]

    def chosen_by_member(self, chosen: np.ndarray) -> np.ndarray:
        """How many of each member's rows `chosen` picks."""
        counts = np.concatenate(([0], np.cumsum(chosen)))
        return counts[self.starts[1:]] - counts[self.starts[:-1]]

    def picked(self, indices: list[int], chosen: np.ndarray) -> tuple[np.ndarray, list[int]]:
        """The chosen rows of members `indices` (ascending) as row numbers of the table, and
        how many of them each member has."""
        taking = self.chosen_by_member(chosen)
        counts = taking[indices]
        if counts.sum() == taking.sum():  # the usual call: every chosen row is theirs
            return np.flatnonzero(chosen), counts.tolist()
        among = np.zeros(len(self.members), dtype=bool)
        among[indices] = True
        return np.flatnonzero(chosen & among[self.owner]), counts.tolist()


class Stages:
    """Runs the later stages of flights' pipelines."""

    def __init__(
        self,
        upstreams: Upstreams,
        routers: dict[StageKey, Router],
        build: RequestBuilder,
        arms: ArmBook,
        shadow: ShadowRunner,
    ) -> None:
        self._up = upstreams
        self._routers = routers
        self._build = build
        self._arms = arms
        self._shadow = shadow
        self._usual: dict[StageKey, float] = {}  # each stage's usual seconds per call

    async def run(
        self,
        members: list[Member],
        features: list[v1.Tensor],
        outputs: list[v1.Tensor],
        first_stage: str,
    ) -> Staged:
        """The flight after `members`' pipeline's later stages (`outputs`: its first
        model's, stacked over the members' rows like `features`)."""
        table = _Table(
            members,
            {t.name: t for t in [*features, *outputs]},
            [t.name for t in outputs],
            {m: [first_stage] for m in members},
        )
        return await self._later(table, features)

    async def stand_in(self, members: list[Member], features: list[v1.Tensor]) -> Staged:
        """The flight after its pipeline's first model's fallback answered in that model's
        place (for all of `members`: the chain sends only those the model could not answer,
        or all of them from the fallback's level), then after the later stages."""
        wire = {t.name: t for t in features}
        table = _Table(members, wire, [], {m: [] for m in members})
        stage = _first_stage(members[0].request.pipeline, wire)
        waiting = [i for i, member in enumerate(members) if member.waiting]
        everyone = np.ones(table.total, dtype=bool)
        fresh: set[str] = set()
        await self._by_arm(table, stage, waiting, everyone, fresh, fallback=True)
        table.given = sorted(fresh)
        return await self._later(table, features)

    async def _later(self, table: _Table, features: list[v1.Tensor]) -> Staged:
        """The flight after the later stages, from `table` (what the first model gave)."""
        members = table.members
        pipeline: Pipeline = members[0].request.pipeline
        for group in pipeline.stage_groups():
            made = await gathering.gather([self._stage(table, stage) for stage in group])
            table.given = [*dict.fromkeys([*table.given, *(n for names in made for n in names)])]
        if any(stage.parallel for stage in pipeline.stages):
            _in_order(table.answered.values(), pipeline)
        kept = [i for i, m in enumerate(members) if m.waiting]
        given = [table.tensor(name) for name in table.given]
        if len(kept) < len(members):
            features = stack.take(features, table.rows, kept)
            given = stack.take(given, table.rows, kept)
        survivors = [members[i] for i in kept]
        return Staged(
            survivors,
            features,
            given,
            {m: table.answered[m] for m in survivors},
            {m: table.degraded[m] for m in survivors if m in table.degraded},
        )

    async def _stage(self, table: _Table, stage: Stage) -> list[str]:
        """Run `stage` for the rows it takes, one call per arm, all at once; the tensors it
        gave anew (none for a conditional stage: it writes over earlier ones)."""
        name = table.members[0].request.pipeline_name
        chosen = _chosen_rows(table, stage.when)
        if not chosen.any():  # a cascade's usual flight at low load: every row is sure
            return []
        taking = table.chosen_by_member(chosen).tolist()
        usual = self._usual.get((name, stage.label), 0.0)
        own, fallback = [], []
        for index, member in enumerate(table.members):
            if not member.waiting or not taking[index]:
                continue
            if member.deadline.left() < usual:
                _too_short(table, member, stage, usual)
            elif _at_level(stage.fallback, member.request.level):
                fallback.append(index)
            else:
                own.append(index)
        fresh: set[str] = set()
        await gathering.gather(
            [
                self._by_arm(table, stage, indices, chosen, fresh, fallback=to_fallback)
                for indices, to_fallback in ((own, False), (fallback, True))
                if indices
            ]
        )
        return sorted(fresh)

    async def _by_arm(
        self,
        table: _Table,
        stage: Stage,
        indices: list[int],
        chosen: np.ndarray,
        fresh: set[str],
        fallback: bool,
    ) -> None:
        """Members `indices` through the stage's model (or its fallback), one call per arm."""
        label = _fallback_label(stage) if fallback else stage.label
        key = (table.members[0].request.pipeline_name, label)
        by_arm: dict[str, tuple[Route, list[int]]] = {}
        unrouted: dict[int, StrataError] = {}
        for index in indices:
            try:
                route = self._routers[key].choose(table.members[index].request.client)
            except StrataError as exc:  # no arm available
                unrouted[index] = exc
                continue
            by_arm.setdefault(route.arm, (route, []))[1].append(index)
        calls = [
            self._call(table, stage, route, group, chosen, fresh, fallback)
            for route, group in by_arm.values()
        ]
        calls += [
            self._failed(table, stage, group, chosen, fresh, fallback, error)
            for group, error in _by_code(unrouted)
        ]
        await gathering.gather(calls)

    async def _failed(
        self,
        table: _Table,
        stage: Stage,
        indices: list[int],
        chosen: np.ndarray,
        fresh: set[str],
        fallback: bool,
        exc: StrataError,
    ) -> None:
        """Members the stage's model could not answer: to its fallback where that may answer
        instead, else they fail with `exc`."""
        if not fallback and stage.fallback is not None and exc.code.name in FALLS_BACK:
            await self._by_arm(table, stage, indices, chosen, fresh, fallback=True)
            return
        for index in indices:
            _fail(table.members[index], exc)

    async def _call(
        self,
        table: _Table,
        stage: Stage,
        route: Route,
        indices: list[int],
        chosen: np.ndarray,
        fresh: set[str],
        fallback: bool,
    ) -> None:
        """One ModelInfer on `route` for the chosen rows of members `indices`."""
        members = [table.members[i] for i in indices]
        rows, counts = table.picked(indices, chosen)
        model = stage.fallback.model if fallback else stage.model
        version = route.version or model.version
        request = self._build(model.name, version, members, counts, table.inputs(stage, rows))
        hop = self._up.inference[route.deployment]
        deadline = latest(m.deadline for m in members)
        started = time.monotonic()
        label = _fallback_label(stage) if fallback else stage.label
        arm = (f"{members[0].request.pipeline_name}/{label}", route.arm)
        with _stage_span(stage, model.name, route, members, len(rows)):
            try:
                if deadline.expired():
                    raise DeadlineExceeded(f"deadline passed before stage {stage.label!r}")
                reply = await hop.call("ModelInfer", request, deadline, spare=False)
            except StrataError as exc:
                self._arms.record(*arm, exc.code.name, 0.0, len(members))
                await self._failed(table, stage, indices, chosen, fresh, fallback, exc)
                return
        self._arms.record(*arm, "OK", time.monotonic() - started, len(members))
        if not fallback:
            self._learn((members[0].request.pipeline_name, stage.label), time.monotonic() - started)
        errors = member_errors(reply.parameters, len(members))
        answered = [i for i in range(len(members)) if i not in errors]
        if answered:
            if errors:
                starts = [0, *accumulate(counts)]
                rows = np.concatenate([rows[starts[i] : starts[i + 1]] for i in answered])
            source = f"inference deployment {route.deployment!r}"
            outputs = _renamed(codec.response_tensors(reply, source), stage.outputs)
            _write(table, stage, outputs, rows, fresh)
            for i in answered:
                table.answered[members[i]].append(label)
                if fallback:
                    table.degraded[members[i]] = FALLBACK
            if not fallback:
                self._mirror(stage, members, answered, counts, request, reply)
        await gathering.gather(
            [
                self._failed(
                    table, stage, [indices[i] for i in group], chosen, fresh, fallback, error
                )
                for group, error in _by_code(errors)
            ]
        )

    def _mirror(
        self,
        stage: Stage,
        members: list[Member],
        answered: list[int],
        rows: list[int],
        request: v2.ModelInferRequest,
        reply: v2.ModelInferResponse,
    ) -> None:
        """Submit the `answered` members (of `members`, `rows` each in the call) that the
        stage's shadow mirrors: each one's rows of the call's inputs and of what the
        stage's model gave for the answered members' rows (its own names, as the mirror's
        answer has them)."""
        router = self._routers[members[0].request.pipeline_name, stage.label]
        if router.shadow is None:
            return
        inputs, given = codec.request_inputs(request), codec.response_outputs(reply)
        sent = [0, *accumulate(rows)]
        back = [0, *accumulate(rows[i] for i in answered)]
        for n, i in enumerate(answered):
            request = members[i].request
            if router.mirrors(request.request_id or request.client):
                self._shadow.submit(
                    router.pipeline,
                    stage.model,
                    {key: array[sent[i] : sent[i + 1]] for key, array in inputs.items()},
                    {key: array[back[n] : back[n + 1]] for key, array in given.items()},
                    request.deadline,
                )

    def _learn(self, key: StageKey, seconds: float) -> None:
        before = self._usual.get(key)
        self._usual[key] = seconds if before is None else before + SMOOTHING * (seconds - before)


def _in_order(answered: Iterable[list[str]], pipeline: Pipeline) -> None:
    """Each member's answering stages in the pipeline's order (parallel ones answer in any)."""
    order = {name: index for index, name in enumerate(pipeline.stage_names())}
    for labels in answered:
        labels.sort(key=lambda label: order[label.removesuffix(FALLBACK_SUFFIX)])


def _fallback_label(stage: Stage) -> str:
    return stage.label + FALLBACK_SUFFIX


def _at_level(fallback: Fallback | None, level: int) -> bool:
    """Whether the ladder's `level` sends requests to `fallback` before its model is tried."""
    return fallback is not None and fallback.from_level is not None and level >= fallback.from_level


def _first_stage(pipeline: Pipeline, features: Iterable[str]) -> Stage:
    """The pipeline's first model as a stage fed by preprocess's outputs (`features`, each
    an input of the model, as start-up checked), with the pipeline's fallback."""
    model = pipeline.model.model_copy(update={"shadow": None})
    inputs = {name: name for name in features}
    return Stage(name=pipeline.model.name, model=model, inputs=inputs, fallback=pipeline.fallback)


def _named(tensor: v1.Tensor, name: str) -> v1.Tensor:
    if tensor.name == name:
        return tensor
    return v1.Tensor(name=name, datatype=tensor.datatype, shape=tensor.shape, data=tensor.data)


def _by_code(errors: dict[int, StrataError]) -> list[tuple[list[int], StrataError]]:
    """Members' errors grouped by status code, each group with its first error."""
    groups: dict[str, tuple[list[int], StrataError]] = {}
    for index, error in errors.items():
        groups.setdefault(error.code.name, ([], error))[0].append(index)
    return list(groups.values())


def _chosen_rows(table: _Table, when: Condition | None) -> np.ndarray:
    """Which rows of the flight the stage runs for (a row whose measure is not a number
    runs it: nothing says it is sure)."""
    if when is None:
        return np.ones(table.total, dtype=bool)
    measure = _measure(table.array(when.tensor).reshape(table.total, -1), when.measure)
    with np.errstate(invalid="ignore"):
        if when.below is not None:
            return ~(measure >= when.below)
        return ~(measure <= when.above)


def _measure(values: np.ndarray, kind: str) -> np.ndarray:
    """One number per row of `values` ([rows, n]). Worked on as [n, rows]: numpy reduces
    across a long axis several times faster than along a short one (a row of 10 logits)."""
    columns = np.array(values.T, dtype=np.float64, order="C")
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "max":
            return columns.max(axis=0)
        if kind == "min":
            return columns.min(axis=0)
        columns -= columns.max(axis=0)
        np.exp(columns, out=columns)  # the top one is exp(0) = 1
        if kind == "top_probability":
            return 1.0 / columns.sum(axis=0)
        columns /= columns.sum(axis=0)
        top = np.sort(columns, axis=0)
        return top[-1] - (top[-2] if len(top) > 1 else 0.0)


def _renamed(outputs: list[v1.Tensor], names: dict[str, str]) -> list[v1.Tensor]:
    return [_named(tensor, names.get(tensor.name, tensor.name)) for tensor in outputs]


def _write(
    table: _Table, stage: Stage, outputs: list[v1.Tensor], rows: np.ndarray, fresh: set[str]
) -> None:
    """Write a stage's outputs into `rows` of the table (as they came where they are every
    row); a conditional stage writes over tensors an earlier stage gave, which must have the
    same kind of rows."""
    for tensor in outputs:
        name, shape = tensor.name, list(tensor.shape)
        if not shape or shape[0] != len(rows):
            raise NotReady(
                f"stage {stage.label!r}: model {stage.model.name!r} answered "
                f"{shape[0] if shape else 0} rows of {name!r} for {len(rows)}"
            )
        kept = _kept(table, stage, tensor, fresh)
        if len(rows) == table.total and kept in (None, tensor.datatype):
            check_declared(name, tensor.datatype, shape, len(tensor.data))
            table.put(tensor)
            continue
        array = codec.from_tensor(tensor)
        if kept is None:
            table.arrays[name] = np.zeros((table.total, *array.shape[1:]), array.dtype)
        present = table.array(name)
        if not present.flags.writeable:  # decoded from the wire: a view of its bytes
            present = table.arrays[name] = present.copy()
        table.wire.pop(name, None)  # written into: its bytes are no longer what it holds
        present[rows] = array


def _kept(table: _Table, stage: Stage, tensor: v1.Tensor, fresh: set[str]) -> str | None:
    """The datatype of what the rows the stage passes over keep of `tensor`'s name; None
    where they keep nothing, the stage giving it anew."""
    name = tensor.name
    if stage.when is None and name not in fresh:
        fresh.add(name)
        return None
    before = table.kind(name)
    if before is None or before[1] != list(tensor.shape[1:]):
        raise NotReady(
            f"stage {stage.label!r} gives {name!r} with rows of shape "
            f"{list(tensor.shape[1:])} where the rows it passes over keep "
            f"{'nothing' if before is None else before[1]}"
        )
    return before[0]


def _too_short(table: _Table, member: Member, stage: Stage, usual: float) -> None:
    """A member whose budget is shorter than the stage's usual time: it leaves with what
    earlier stages gave it, marked degraded, where the stage is conditional; else it fails."""
    if stage.when is not None:
        table.degraded[member] = EARLY_EXIT
        return
    _fail(
        member,
        DeadlineExceeded(
            f"stage {stage.label!r} usually takes {usual * 1e3:.0f} ms, more than the "
            f"{max(member.deadline.left(), 0) * 1e3:.0f} ms left"
        ),
    )


def _fail(member: Member, exc: BaseException) -> None:
    if member.waiting:
        member.future.set_exception(exc)


@contextlib.contextmanager
def _stage_span(
    stage: Stage, model: str, route: Route, members: Sequence[Member], rows: int
) -> Iterator[None]:
    """The stage's span, linked to the sampled members it carried."""
    sampled = [s for s in (trace.get_current_span(m.context) for m in members) if s.is_recording()]
    if not sampled and not trace.get_current_span().is_recording():
        yield
        return
    attributes = {
        "strata.stage": stage.label,
        "strata.model": model,
        "strata.arm": route.arm,
        "strata.rows": rows,
        "strata.requests": len(members),
    }
    links = [Link(s.get_span_context()) for s in sampled]
    span = TRACER.start_span(f"stage {stage.label}", links=links, attributes=attributes)
    with propagation.Current(span):
        yield
