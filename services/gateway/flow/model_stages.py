"""A pipeline's later model stages, run over a flight after its first model.

The flight's tensors make one table of rows (rows.py). Each stage takes the rows it runs
for (all of them, or those its condition picks), calls its model with just those rows, one
ModelInfer per arm, and writes its outputs back into their rows. A row a conditional stage
passes over keeps what earlier stages gave it: a cascade's early exit. Each member keeps its
own error (a stage's error for one member fails only that member), its own deadline (a stage
is not started for a member whose budget is shorter than the stage's usual time: it leaves
with its earlier answer, marked degraded, or fails where the stage was not optional) and its
own trace (each stage is a span linked to the members it carried). A stage with a fallback
runs that cheaper model instead for the members its own could not answer (fallback.py); the
pipeline's first model's fallback runs here too, as a stage (`stand_in`). Each call is made,
counted in its arm's figures (under `<pipeline>/<stage>`) and, where it fails, moved to
another arm or the fallback, as every model call of a flight is (model_calls.py). A stage's
shadow gets a copy of each mirrored member's rows its own model answered (mirror.py). What
postprocess receives is every tensor a model gave, for the members still waiting.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate

import numpy as np
from opentelemetry import trace
from opentelemetry.trace import Link

from services.gateway.flow import blame
from services.gateway.flow import fallback as fallbacks
from services.gateway.flow.flights import Member
from services.gateway.flow.mirror import mirror_stage
from services.gateway.flow.model_calls import Model, ModelCalls, Reply
from services.gateway.flow.rows import Table, chosen_rows, renamed, write
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.upstream.router import Router
from strata.calls import gathering
from strata.config.pipelines import Fallback, ModelRef, Pipeline, Route, Stage
from strata.config.settings import Settings
from strata.errors import DeadlineExceeded, StrataError
from strata.proto.v1 import tensor_pb2 as v1
from strata.telemetry import propagation
from strata.wire import stack

TRACER = trace.get_tracer("services.gateway")
# A degraded answer's source when a member left a cascade early because its budget was
# shorter than the next stage's usual time.
EARLY_EXIT = "early_exit"

StageKey = tuple[str, str]  # (pipeline, stage; "<stage>/fallback" for its fallback)


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
        models.append((pipeline.model.name + fallbacks.SUFFIX, pipeline.fallback.model))
    for stage in pipeline.stages:
        models.append((stage.label, stage.model))
        if stage.fallback is not None:
            models.append((fallbacks.label(stage), stage.fallback.model))
    return models


@dataclass
class Staged:
    """A flight after its stages: the members still waiting, their rows of preprocess's
    outputs and of every tensor a model gave, which stages answered each one, and why an
    answer is degraded (EARLY_EXIT, fallback.FALLBACK), where it is."""

    members: list[Member]
    features: list[v1.Tensor]
    given: list[v1.Tensor]
    answered: dict[Member, list[str]]
    degraded: dict[Member, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StageRun:
    """One stage over a flight: the flight's table, the rows the stage takes (`chosen`), the
    tensors it gave anew so far (`fresh`, shared with its fallback's run), and the stage's
    fallback where that answers in its model's place."""

    table: Table
    stage: Stage
    chosen: np.ndarray
    fresh: set[str] = field(default_factory=set)
    fallback: Fallback | None = None

    @property
    def pipeline(self) -> str:
        return self.table.members[0].request.pipeline_name

    @property
    def label(self) -> str:
        """Its label in strata.stages and the arms' figures."""
        return fallbacks.label(self.stage) if self.fallback is not None else self.stage.label

    @property
    def model(self) -> ModelRef:
        return self.fallback.model if self.fallback is not None else self.stage.model

    def to_fallback(self) -> StageRun:
        """The same run, on the stage's fallback model."""
        return replace(self, fallback=self.stage.fallback)


class Stages:
    """Runs the later stages of flights' pipelines."""

    def __init__(
        self, routers: dict[StageKey, Router], calls: ModelCalls, shadow: ShadowRunner
    ) -> None:
        self._routers = routers
        self._calls = calls
        self._shadow = shadow

    async def run(
        self,
        members: list[Member],
        features: list[v1.Tensor],
        outputs: list[v1.Tensor],
        first_stage: str,
    ) -> Staged:
        """The flight after `members`' pipeline's later stages (`outputs`: its first
        model's, stacked over the members' rows like `features`)."""
        table = Table(
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
        table = Table(members, wire, [], {m: [] for m in members})
        stage = fallbacks.first_stage(members[0].request.pipeline, wire)
        waiting = [i for i, member in enumerate(members) if member.waiting]
        run = StageRun(table, stage, np.ones(table.total, dtype=bool)).to_fallback()
        await self._by_arm(run, waiting)
        table.given = sorted(run.fresh)
        return await self._later(table, features)

    async def _later(self, table: Table, features: list[v1.Tensor]) -> Staged:
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

    async def _stage(self, table: Table, stage: Stage) -> list[str]:
        """Run `stage` for the rows it takes, one call per arm, all at once; the tensors it
        gave anew (none for a conditional stage: it writes over earlier ones)."""
        name = table.members[0].request.pipeline_name
        chosen = chosen_rows(table, stage.when)
        if not chosen.any():  # a cascade's usual flight at low load: every row is sure
            return []
        taking = table.chosen_by_member(chosen).tolist()
        usual = self._calls.usual(f"{name}/{stage.label}")
        own, fallback = [], []
        for index, member in enumerate(table.members):
            if not member.waiting or not taking[index]:
                continue
            if member.deadline.left() < usual:
                _too_short(table, member, stage, usual)
            elif fallbacks.at_level(stage.fallback, member.request.level):
                fallback.append(index)
            else:
                own.append(index)
        run = StageRun(table, stage, chosen)
        runs = ((run, own), (run.to_fallback(), fallback))
        await gathering.gather([self._by_arm(each, indices) for each, indices in runs if indices])
        return sorted(run.fresh)

    async def _by_arm(self, run: StageRun, indices: list[int]) -> None:
        """Members `indices` through the run's model, one call per arm."""
        router = self._routers[run.pipeline, run.label]
        by_arm: dict[str, tuple[Route, list[int]]] = {}
        unrouted: dict[int, StrataError] = {}
        for index in indices:
            try:
                route = router.choose(run.table.members[index].request.client)
            except StrataError as exc:  # no arm available
                unrouted[index] = exc
                continue
            by_arm.setdefault(route.arm, (route, []))[1].append(index)
        calls = [self._call(run, route, group, moving=True) for route, group in by_arm.values()]
        if unrouted:
            calls.append(self._failed(run, unrouted, None))
        await gathering.gather(calls)

    async def _failed(
        self, run: StageRun, errors: dict[int, StrataError], moving_from: Route | None
    ) -> None:
        """Members the run's model failed (`errors`, by index): each on another arm of the
        model, on the stage's fallback, or failed with its error (model_calls.py decides)."""
        after = self._calls.after(self._model(run), run.table.members, errors, moving_from)
        calls = [
            self._call(run, route, group, moving=False) for route, group in after.moved.values()
        ]
        if after.fallback:
            calls.append(self._by_arm(run.to_fallback(), after.fallback))
        await gathering.gather(calls)

    async def _call(self, run: StageRun, route: Route, indices: list[int], moving: bool) -> None:
        """One ModelInfer on `route` for the chosen rows of members `indices`; `moving`:
        whether they may still move to another arm, should this one be unavailable."""
        table, stage = run.table, run.stage
        members = [table.members[i] for i in indices]
        rows, counts = table.picked(indices, run.chosen)
        model = self._model(run)
        spare = moving and self._calls.spare(model, members[0].request.client, route)
        inputs = table.inputs(stage, rows)
        with _stage_span(stage, model.ref.name, route, members, len(rows)):
            try:
                reply = await self._calls.call(model, route, members, counts, inputs, spare=spare)
            except StrataError as exc:
                await self._failed(run, dict.fromkeys(indices, exc), route if moving else None)
                return
        answered = [i for i in range(len(members)) if i not in reply.errors]
        if answered:
            self._write(run, members, answered, counts, rows, reply)
        if reply.errors:
            await self._failed(run, {indices[i]: e for i, e in reply.errors.items()}, None)

    def _write(
        self,
        run: StageRun,
        members: list[Member],
        answered: list[int],
        counts: list[int],
        rows: np.ndarray,
        reply: Reply,
    ) -> None:
        """What the run's model gave the `answered` members (of `members`, `counts` rows
        each of the call's `rows`), written into their rows of the table."""
        table, stage = run.table, run.stage
        if reply.errors:
            starts = [0, *accumulate(counts)]
            rows = np.concatenate([rows[starts[i] : starts[i + 1]] for i in answered])
        write(table, stage, renamed(reply.outputs, stage.outputs), rows, run.fresh)
        for i in answered:
            table.answered[members[i]].append(run.label)
            if run.fallback is not None:
                table.degraded[members[i]] = fallbacks.FALLBACK
        if run.fallback is None:
            router = self._routers[run.pipeline, stage.label]
            mirror_stage(
                self._shadow, router, stage, members, answered, counts, reply.request, reply.reply
            )

    def _model(self, run: StageRun) -> Model:
        """The run's model as its calls make it."""
        return Model(
            f"{run.pipeline}/{run.label}",
            run.model,
            self._routers[run.pipeline, run.label],
            functools.partial(blame.later_stage, run.pipeline, run.label),
            run.fallback is None and run.stage.fallback is not None,
        )


def _in_order(answered: Iterable[list[str]], pipeline: Pipeline) -> None:
    """Each member's answering stages in the pipeline's order (parallel ones answer in any)."""
    order = {name: index for index, name in enumerate(pipeline.stage_names())}
    for labels in answered:
        labels.sort(key=lambda label: order[label.removesuffix(fallbacks.SUFFIX)])


def _too_short(table: Table, member: Member, stage: Stage, usual: float) -> None:
    """A member whose budget is shorter than the stage's usual time: it leaves with what
    earlier stages gave it, marked degraded, where the stage is conditional; else it fails."""
    if stage.when is not None:
        table.degraded[member] = EARLY_EXIT
        return
    member.fail(
        DeadlineExceeded(
            f"stage {stage.label!r} usually takes {usual * 1e3:.0f} ms, more than the "
            f"{max(member.deadline.left(), 0) * 1e3:.0f} ms left"
        ),
    )


@contextlib.contextmanager
def _stage_span(
    stage: Stage, model: str, route: Route, members: Sequence[Member], rows: int
) -> Iterator[None]:
    """The stage's span, linked to the sampled members it carried."""
    sampled = [s for s in (trace.get_current_span(m.context) for m in members) if s.is_recording()]
    if not sampled and not trace.get_current_span().is_recording():
        yield
        return
    attributes: dict[str, str | int] = {
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
