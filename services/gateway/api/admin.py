"""strata.v1.Admin on the gateway: status, route weights, forced levels, config reload.

Registered only when an admin token is configured; every call must carry it as
`authorization: Bearer <token>` (strata.security.bearer), the token of the config as last
(re)loaded.
"""

from __future__ import annotations

import numpy as np
from grpc.aio import ServicerContext as Context

from services.gateway.door.concurrency import AdaptiveLimit
from services.gateway.door.ladder import Reading
from services.gateway.flow.model_stages import later_models
from services.gateway.metrics import RATE_LIMITED, SHED, UPSTREAM_CALLS
from services.gateway.runtime import Runtime
from services.gateway.upstream.router import Router
from strata.calls.grpc_errors import grpc_errors
from strata.errors import InvalidArgument, NotFound, listed, shown
from strata.process.workers import tell_siblings
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.security.bearer import ControlAuth


def admin_auth(runtime: Runtime) -> ControlAuth:
    """The check of the gateway's control calls (the admin API and model repository
    control), one throttle for both: the admin token of the config as last (re)loaded."""

    def token() -> str | None:
        token = runtime.settings.gateway.admin_token
        return token.get_secret_value() if token is not None else None

    return ControlAuth("the gateway's control calls", "gateway.admin_token", token)


class AdminServicer(admin_pb2_grpc.AdminServicer):
    def __init__(self, runtime: Runtime, auth: ControlAuth) -> None:
        self._runtime = runtime
        self._auth = auth

    @grpc_errors
    async def Status(
        self,
        request: admin_pb2.StatusRequest,
        context: Context[admin_pb2.StatusRequest, admin_pb2.StatusResponse],
    ) -> admin_pb2.StatusResponse:
        self._auth.check(context)
        return await self._status()

    @grpc_errors
    async def SetWeights(
        self,
        request: admin_pb2.SetWeightsRequest,
        context: Context[admin_pb2.SetWeightsRequest, admin_pb2.StatusResponse],
    ) -> admin_pb2.StatusResponse:
        self._auth.check(context)
        self._runtime.changing_live("SetWeights")
        self._router(request.pipeline).set_weights(dict(request.weights))
        return await self._status()

    def _router(self, name: str) -> Router:
        """A pipeline's router (its first model's arms), or a later stage's or fallback's
        by `<pipeline>/<label>` as the status lists them."""
        runtime = self._runtime
        if name in runtime.routers:
            return runtime.router(name)
        pipeline, _, label = name.partition("/")
        router = runtime.stage_routers.get((pipeline, label))
        if router is None:
            stages = (f"{pipeline}/{label}" for pipeline, label in runtime.stage_routers)
            raise NotFound(
                f"unknown pipeline or stage {shown(name)}: a pipeline's name "
                f"({listed(runtime.routers)}), or <pipeline>/<stage> as the status lists its "
                f"later stages ({listed(stages)})"
            )
        return router

    @grpc_errors
    async def ForceLevel(
        self,
        request: admin_pb2.ForceLevelRequest,
        context: Context[admin_pb2.ForceLevelRequest, admin_pb2.StatusResponse],
    ) -> admin_pb2.StatusResponse:
        self._auth.check(context)
        self._runtime.changing_live("ForceLevel")
        if request.release:
            self._runtime.ladder.force(None)
        elif not 0 <= request.level <= 4:
            raise InvalidArgument(f"level must be 0..4, got {request.level}")
        else:
            self._runtime.ladder.force(request.level)
        return await self._status()

    @grpc_errors
    async def Reload(
        self,
        request: admin_pb2.ReloadRequest,
        context: Context[admin_pb2.ReloadRequest, admin_pb2.ReloadResponse],
    ) -> admin_pb2.ReloadResponse:
        self._auth.check(context)
        applied, restart, kept = self._runtime.reload()
        tell_siblings()  # other gateway processes re-read the file too
        return admin_pb2.ReloadResponse(applied=applied, needs_restart=restart, kept_live=kept)

    async def _status(self) -> admin_pb2.StatusResponse:
        runtime = self._runtime
        ladder, limits = runtime.ladder, runtime.limits.limits
        return admin_pb2.StatusResponse(
            level=ladder.level,
            level_name=runtime.level_name(),
            forced=ladder.forced is not None,
            pressure=ladder.last_pressure,
            signals={name: _reading(r) for name, r in ladder.readings.items()},
            level_reason=ladder.reason,
            concurrency={name: _concurrency(limit) for name, limit in limits.items()},
            pipelines={name: self._pipeline(name) for name in runtime.routers},
            upstreams=await runtime.upstreams.healthy(),
            inflight=sum(limit.inflight for limit in limits.values()),
            cache_entries=len(runtime.cache),
            counters=_counters(),
        )

    def _arms(
        self, figures_of: str, model: str, router: Router, configured: dict[str, float]
    ) -> list[admin_pb2.ArmStatus]:
        """Each of `router`'s arms: its live weight, figures (kept under `figures_of`) and
        `model`'s circuit on its deployment."""
        runtime = self._runtime
        arms = []
        for route in router.routes:
            figures = runtime.arms.get(figures_of, route.arm)
            p50, p95, p99 = figures.percentiles_ms()
            breaker = runtime.upstreams.inference[route.deployment].breaker.state(model)
            arms.append(
                admin_pb2.ArmStatus(
                    arm=route.arm,
                    deployment=route.deployment,
                    version=route.version,
                    weight=route.weight,
                    requests=figures.requests,
                    errors=figures.errors,
                    p50_ms=p50,
                    p95_ms=p95,
                    p99_ms=p99,
                    breaker=breaker,
                    config_weight=configured.get(route.arm, route.weight),
                )
            )
        return arms

    def _pipeline(self, name: str) -> admin_pb2.PipelineStatus:
        runtime = self._runtime
        pipeline = runtime.settings.pipelines[name]
        router = runtime.router(name)
        configured = {route.arm: route.weight for route in runtime.settings.routes(name)}
        arms = self._arms(name, pipeline.model.name, router, configured)
        stages = [
            admin_pb2.StageStatus(
                stage=label,
                model=model.name,
                arms=self._arms(
                    f"{name}/{label}",
                    model.name,
                    runtime.stage_routers[name, label],
                    {route.arm: route.weight for route in runtime.settings.model_routes(model)},
                ),
                shadow=self._shadow(runtime.stage_routers[name, label]),
            )
            for label, model in later_models(pipeline)
        ]
        return admin_pb2.PipelineStatus(arms=arms, shadow=self._shadow(router), stages=stages)

    def _shadow(self, router: Router) -> admin_pb2.ShadowStatus | None:
        """`router`'s shadow and its figures (kept under the router's name), or None."""
        if router.shadow is None:
            return None
        status = admin_pb2.ShadowStatus(
            deployment=router.shadow.deployment, version=router.shadow.version
        )
        stats = self._runtime.shadow.stats.get(router.pipeline)
        if stats is not None:
            status.compared = stats.compared
            status.agreed = stats.agreed
            status.errors = stats.errors
            status.dropped = stats.dropped
            if stats.latencies:
                status.p50_ms = float(np.median(stats.latencies) * 1000)
        return status


def _reading(reading: Reading) -> admin_pb2.SignalReading:
    return admin_pb2.SignalReading(
        value=reading.value,
        threshold=reading.threshold,
        unit=reading.unit.strip(),
        pressure=reading.pressure,
    )


def _concurrency(limit: AdaptiveLimit) -> admin_pb2.ConcurrencyStatus:
    return admin_pb2.ConcurrencyStatus(
        limit=limit.limit,
        inflight=limit.inflight,
        baseline_ms=(limit.baseline or 0.0) * 1000,
        recent_ms=limit.recent * 1000,
        clients=len(limit.holders),
    )


def _counters() -> dict[str, float]:
    """Sums of a few counters by their first label: upstream calls, limits, sheds."""
    out: dict[str, float] = {}
    for prefix, metric in (
        ("upstream_calls", UPSTREAM_CALLS.metric),
        ("rate_limited", RATE_LIMITED),
        ("shed", SHED),
    ):
        for family in metric.collect():
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    label = next(iter(sample.labels.values()))
                    key = f"{prefix}.{label}"
                    out[key] = out.get(key, 0.0) + sample.value
    return out
