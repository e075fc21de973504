"""One client request at the gateway, shaped by the degradation level and the routes.

validate -> route -> (cache, default answer or shed, by level) -> board a flight, which
carries it through preprocess, inference on its arm and postprocess with the requests it
shares them with (flow/flights.py, flow/chain.py). The level decides
what is skipped: optional rules (1), batching (2), the whole chain in favour of a cached or
default answer (3), or the request itself (4).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from services.gateway.door.admission import Admission
from services.gateway.door.ladder import LadderController
from services.gateway.door.policy import Checkpoint, Entry
from services.gateway.flow.cache import Cached, ResultCache, cache_key, consulted
from services.gateway.flow.flights import Flights, Member
from services.gateway.flow.sizing import Sizes, arm_of
from services.gateway.metrics import CACHE, DEGRADED, INFLIGHT
from services.gateway.request import Answer, ClientRequest
from services.gateway.upstream.router import Router
from strata.config.gateway import FlightSettings
from strata.config.pipelines import OutputSpec, Route
from strata.errors import StrataError, Unavailable
from strata.shapes.schema import validate_inputs
from strata.wire import codec, stack

UNWELL = {"UNAVAILABLE", "INTERNAL", "UNKNOWN"}


class Orchestrator:
    def __init__(
        self,
        *,
        ladder: LadderController,
        cache: ResultCache,
        routers: dict[str, Router],
        admission: Admission,
        sizes: Sizes,
        flights: Flights,
        usable: Callable[[Route], bool],
    ) -> None:
        self.ladder = ladder
        self.cache = cache
        self.routers = routers
        self.admission = admission
        self.sizes = sizes
        self.flights = flights
        self._usable = usable  # whether a route's deployment takes calls now (its circuit)

    def configure_flights(self, flights: FlightSettings, message_limit: int) -> None:
        """New bounds for the flights that leave from now on."""
        self.flights.configure(flights)
        self.sizes.configure(message_limit, flights.message_margin)

    async def close(self) -> None:
        await self.flights.close()
        await self.sizes.close()

    async def infer(self, req: ClientRequest) -> Answer:
        pipeline, name = req.pipeline, req.pipeline_name
        rows = validate_inputs(req.arrays, pipeline.inputs, pipeline.max_batch_size)
        route = self._route(req)
        req.route, req.version = route, route.version or pipeline.model.version
        req.level = level = self.ladder.level
        key = self._cache_key(req, route)
        # A sequence's answer depends on its state: never a cached or default one.
        early = None if req.sequence else self._answer_without_chain(req, route, key, level, rows)
        if early is not None:
            return early
        member = _member(req, rows)
        self.sizes.refuse_alone(arm_of(req), rows, member.size)
        held = await self.admission.admit(_entry(req), Checkpoint.BOARDING)
        signals = self.ladder.signals
        INFLIGHT.inc()
        started = time.monotonic()
        telling = False  # whether the outcome says how the chain is doing
        try:
            answer = await self.flights.board(_flight_key(req, route), member)
            telling = True
        except StrataError as exc:
            kind = _outcome_kind(exc)
            telling = bool(kind) or exc.code.name == "DEADLINE_EXCEEDED"
            if kind:
                signals.record(name, time.monotonic() - started, kind)
            raise
        finally:
            self.admission.leave(held, telling)
            INFLIGHT.dec()
        signals.record(name, time.monotonic() - started, "ok")
        if answer.degraded:  # a model's fallback, or an early exit from a cascade
            DEGRADED.labels(answer.degraded).inc()
        # A partial or degraded answer is never served as a full one (a sequence's has no key).
        if key is not None and not (answer.skipped_rules or answer.degraded):
            cached = Cached(answer.outputs, answer.arm, answer.model_version, answer.stages)
            self.cache.put(key, cached)
        return answer

    def _cache_key(self, req: ClientRequest, route: Route) -> str | None:
        """The request's key in the result cache; None where no lookup could read its
        answer (no key to hash, no answer to keep): a sequence's, which depends on its
        state, and where flow/cache.py `consulted` says so."""
        if req.sequence is not None:
            return None
        pipeline, ladder = req.pipeline, self.ladder
        highest = max(ladder.settings.max_level, ladder.forced or 0)
        if not consulted(self.cache.settings, pipeline.cache, req.level, highest):
            return None
        # The client's parameters are part of what it asked: `when:` rules depend on them.
        variant = f"{route.deployment}:{req.version}:{sorted(req.parameters.items())}"
        principal = "" if pipeline.shared_cache else req.client
        return cache_key(req.pipeline_name, variant, req.inputs, principal)

    def _route(self, req: ClientRequest) -> Route:
        """The request's arm; where none is available and the pipeline's model has a
        fallback, the client's own arm all the same: that arm's call fails at once (its
        circuit open) and the fallback answers in its place."""
        router = self.routers[req.pipeline_name]
        try:
            return router.choose(req.client, req.forced_arm, self._usable)
        except Unavailable:
            if req.pipeline.fallback is None:
                raise
            return router.sticky(req.client)

    def _answer_without_chain(
        self, req: ClientRequest, route: Route, key: str | None, level: int, rows: int
    ) -> Answer | None:
        """A cached or default answer where the level or the pipeline allows."""
        pipeline = req.pipeline
        if key is not None and (pipeline.cache or level >= 3):
            hit = self.cache.get(key)
            CACHE("hit" if hit else "miss").inc()
            if hit is not None:
                degraded = "cache" if level >= 3 else ""
                if degraded:
                    DEGRADED.labels("cache").inc()
                answer = Answer(hit.outputs, hit.arm, hit.model_version, level, degraded, True)
                answer.stages = hit.stages
                return answer
        if level >= 3 and pipeline.default_answer:
            DEGRADED.labels("default").inc()
            outputs = default_outputs(pipeline.outputs, pipeline.default_answer, rows)
            return Answer(outputs, route.arm, "", level, "default")
        return None


def _flight_key(req: ClientRequest, route: Route) -> tuple[object, ...]:
    """What the requests of one flight must share (`route`: the request's arm); a request
    without a batch dimension, or of a sequence, shares with none (its own identity, while
    it waits)."""
    return (
        id(req) if req.pipeline.max_batch_size == 0 or req.sequence else None,
        req.pipeline_name,
        route.arm,
        req.version,
        req.level,
        bool(req.forced_arm),
        stack.signature(req.inputs),
        tuple(sorted(req.parameters.items())),
    )


def _entry(req: ClientRequest) -> Entry:
    return Entry(req.caller, req.pipeline_name, req.client, req.forced_arm, req.deadline, req.level)


def _member(req: ClientRequest, rows: int) -> Member:
    return Member(req, rows, req.deadline, size=sum(len(t.data) for t in req.inputs))


def default_outputs(
    specs: list[OutputSpec], answer: dict[str, list[Any]], batch: int
) -> codec.Arrays:
    """A pipeline's configured default `answer` for its outputs (`specs`), one row per
    request row."""
    outputs = {}
    for spec in specs:
        row = answer[spec.name]
        if spec.datatype == "BYTES":
            values = np.array([str(v).encode() for v in row], dtype=object)
        else:
            values = np.array(row, dtype=codec.DTYPES[spec.datatype])
        outputs[spec.name] = np.stack([values] * batch)
    return outputs


def _outcome_kind(exc: StrataError) -> str:
    """How a failure counts for the ladder: upstream unwell, a rejection, or not at all."""
    if exc.code.name in UNWELL:
        return "error"
    if exc.code.name == "RESOURCE_EXHAUSTED":
        return "rejected"
    return ""
