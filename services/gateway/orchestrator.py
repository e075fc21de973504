"""One client request through the chain, shaped by the degradation level and the routes.

validate -> (cache) -> preprocess -> inference on the request's arm (and maybe the shadow)
-> postprocess. The level decides what is skipped: optional rules (1), batching (2), the
whole chain in favour of a cached or default answer (3), or the request itself (4).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import numpy as np

from services.gateway.arms import ArmBook
from services.gateway.cache import Cached, ResultCache, cache_key
from services.gateway.coalescer import Coalescer
from services.gateway.ladder import LadderController
from services.gateway.metrics import CACHE, DEGRADED, FAILOVERS, INFLIGHT, SHED
from services.gateway.router import Router
from services.gateway.shadow import ShadowRunner
from services.gateway.upstreams import Upstreams
from strata import codec
from strata.codec import Arrays
from strata.config import Pipeline, Route
from strata.errors import DeadlineExceeded, Overloaded, StrataError, Unavailable
from strata.process import raise_for_result
from strata.proto.v1 import tensor_pb2 as v1
from strata.schema import validate_inputs

log = logging.getLogger(__name__)
UNWELL = {"UNAVAILABLE", "INTERNAL", "UNKNOWN"}


class Budget:
    """What is left of the caller's deadline; work past it is dropped before it costs CPU."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self, hop: str) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"deadline passed before {hop}")
        return left


@dataclass
class ClientRequest:
    pipeline_name: str
    pipeline: Pipeline
    arrays: Arrays
    request_id: str
    client: str
    forced_arm: str
    budget: Budget
    # The client's string parameters, passed to postprocess rules' `when:` conditions.
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass
class Answer:
    outputs: Arrays
    arm: str
    model_version: str
    level: int
    degraded: str = ""  # "", "cache" or "default"
    cached: bool = False
    skipped_rules: str = ""


class Orchestrator:
    def __init__(
        self,
        upstreams: Upstreams,
        ladder: LadderController,
        cache: ResultCache,
        routers: dict[str, Router],
        shadow: ShadowRunner,
        arms: ArmBook,
    ) -> None:
        self._up = upstreams
        self.arms = arms
        self.ladder = ladder
        self.cache = cache
        self.routers = routers
        self._shadow = shadow

    async def infer(self, req: ClientRequest) -> Answer:
        pipeline, name = req.pipeline, req.pipeline_name
        batch = validate_inputs(req.arrays, pipeline.inputs, pipeline.max_batch_size)
        route = self.routers[name].choose(req.client, req.forced_arm, self._usable)
        version = route.version or pipeline.model.version
        key = cache_key(name, f"{route.deployment}:{version}", req.arrays)
        level = self.ladder.level
        early = self._answer_without_chain(req, route, key, level, batch)
        if early is not None:
            return early
        signals = self.ladder.signals
        signals.inflight += 1
        INFLIGHT.inc()
        started = time.monotonic()
        try:
            answer = await self._chain(req, route, version, level)
        except StrataError as exc:
            kind = _outcome_kind(exc)
            if kind:
                signals.record(name, time.monotonic() - started, kind)
            raise
        finally:
            signals.inflight -= 1
            INFLIGHT.dec()
        signals.record(name, time.monotonic() - started, "ok")
        self.cache.put(key, Cached(answer.outputs, answer.arm, answer.model_version))
        return answer

    def _usable(self, route: Route) -> bool:
        return self._up.inference[route.deployment].breaker.available

    def _answer_without_chain(
        self, req: ClientRequest, route: Route, key: str, level: int, batch: int
    ) -> Answer | None:
        """A cached or default answer where the level or the pipeline allows; or shed."""
        pipeline = req.pipeline
        if pipeline.cache or level >= 3:
            hit = self.cache.get(key)
            CACHE.labels("hit" if hit else "miss").inc()
            if hit is not None:
                degraded = "cache" if level >= 3 else ""
                if degraded:
                    DEGRADED.labels("cache").inc()
                return Answer(hit.outputs, hit.arm, hit.model_version, level, degraded, True)
        if level >= 3 and pipeline.default_answer:
            DEGRADED.labels("default").inc()
            outputs = default_outputs(pipeline, batch)
            return Answer(outputs, route.arm, "", level, "default")
        settings = self.ladder.settings
        limit = settings.concurrency_limit
        if level >= 4:
            limit = max(1, int(limit * settings.shed_admit_fraction))
        if self.ladder.signals.inflight >= limit:
            reason = "level" if level >= 4 else "concurrency"
            SHED.labels(reason).inc()
            raise Overloaded(
                f"gateway overloaded ({limit} requests in flight); retry later",
                settings.shed_retry_ms / 1000,
            )
        return None

    async def _chain(self, req: ClientRequest, route: Route, version: str, level: int) -> Answer:
        name, budget = req.pipeline_name, req.budget
        features, _ = await self._process(
            self._up.preprocess_calls, name, req.request_id, req.arrays, budget, {}
        )
        try:
            scores, served_version = await self._infer(route, req, features, version, level >= 2)
        except Unavailable as exc:
            route = self._failover(req, route, exc)
            version = route.version or req.pipeline.model.version
            scores, served_version = await self._infer(route, req, features, version, level >= 2)
        if self.routers[name].mirrors(req.request_id or req.client):
            self._shadow.submit(name, req.pipeline, features, scores, budget)
        flags = {**req.parameters, "core_only": "true" if level >= 1 else "false"}
        forwarded = _forwarded(req.pipeline, features)
        outputs, info = await self._process(
            self._up.postprocess_calls,
            name,
            req.request_id,
            {**scores, **forwarded},
            budget,
            flags,
        )
        skipped = info.get("skipped_rules", "")
        return Answer(outputs, route.arm, served_version, level, skipped_rules=skipped)

    def _failover(self, req: ClientRequest, failed: Route, exc: Unavailable) -> Route:
        """The arm to try when `failed` could not answer; the error if there is none."""
        if req.forced_arm:
            raise exc
        other = self.routers[req.pipeline_name].fallback(req.client, failed, self._usable)
        if other is None:
            raise exc
        FAILOVERS.labels(req.pipeline_name, failed.arm, other.arm).inc()
        return other

    async def _infer(
        self, route: Route, req: ClientRequest, features: Arrays, version: str, skip: bool
    ) -> tuple[Arrays, str]:
        model = req.pipeline.model.name
        request = codec.build_request(model, features, version, req.request_id)
        if skip:
            request.parameters["skip_batching"].bool_param = True
        hop = self._up.inference[route.deployment]
        started = time.monotonic()
        try:
            reply = await hop.call("ModelInfer", request, req.budget.remaining(hop.name))
        except StrataError as exc:
            self.arms.record(req.pipeline_name, route.arm, exc.code.name, 0.0)
            raise
        self.arms.record(req.pipeline_name, route.arm, "OK", time.monotonic() - started)
        return codec.response_outputs(reply), reply.model_version

    async def _process(
        self,
        calls: Coalescer,
        pipeline: str,
        request_id: str,
        arrays: Arrays,
        budget: Budget,
        flags: dict,
    ) -> tuple[Arrays, dict[str, str]]:
        item = v1.Request(
            id=request_id,
            pipeline=pipeline,
            tensors=codec.arrays_to_tensors(arrays),
            parameters=flags,
        )
        result = await calls.process(item, budget.remaining(calls.hop.name))
        return raise_for_result(result), dict(result.info)


def _forwarded(pipeline: Pipeline, features: Arrays) -> Arrays:
    """The preprocess outputs the pipeline passes on to postprocess."""
    missing = sorted(set(pipeline.forward_to_postprocess) - set(features))
    if missing:
        raise RuntimeError(f"forward_to_postprocess names {missing}, not preprocess outputs")
    return {key: features[key] for key in pipeline.forward_to_postprocess}


def default_outputs(pipeline: Pipeline, batch: int) -> Arrays:
    """The pipeline's configured default answer, one row per request row."""
    outputs = {}
    for spec in pipeline.outputs:
        row = pipeline.default_answer[spec.name]
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
