"""The gateway's live state: its policies, routes and ladder, and how a reload changes them.

Settings that are safe to change live (rate limits, ladder thresholds, cache, breakers,
route weights, latency objectives, default answers, API keys and the admin token, their
files re-read, the share of traces sampled) are applied to the running objects. A reload
applies the file whole or nothing of it: when anything else changed (a pipeline added or
removed, an address, a pipeline's inputs...), it says what needs a restart and applies
nothing, so the running gateway is always the old file or the new one, never a mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from dataclasses import dataclass, field

from pydantic import BaseModel

from services.gateway.door.admission import Admission
from services.gateway.door.concurrency import AdaptiveLimits, objectives
from services.gateway.door.ladder import LEVELS, LadderController
from services.gateway.door.probe import DoorProbe
from services.gateway.flow.cache import ResultCache
from services.gateway.flow.model_stages import StageKey
from services.gateway.flow.orchestrator import Orchestrator
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.metrics import LEVEL, LEVEL_CHANGES
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from services.gateway.upstream.upstreams import Upstreams
from strata.config import ConfigError, Settings, load_settings
from strata.config.base import live_fields
from strata.config.gateway import GatewaySettings
from strata.config.pipelines import Pipeline
from strata.errors import NotFound, NotReady, StrataError, listed, shown
from strata.process.workers import sharing
from strata.telemetry import tracing

log = logging.getLogger(__name__)
LIVE_GATEWAY = live_fields(GatewaySettings)
LIVE_PIPELINE = live_fields(Pipeline)


def level_changed(old: int, new: int, why: str) -> None:
    """The ladder's level in the metrics, and which way it moved."""
    LEVEL.set(new)
    LEVEL_CHANGES.labels("up" if new > old else "down").inc()


@dataclass(eq=False)
class Runtime:
    """The rooms' live objects, built once by the composition root (services/gateway/app.py),
    and the settings in force, swapped whole on reload."""

    settings: Settings
    upstreams: Upstreams
    ladder: LadderController
    door_probe: DoorProbe
    cache: ResultCache
    limits: AdaptiveLimits
    routers: dict[str, Router]
    # Each later stage's and fallback's router, by (pipeline, label in strata.stages).
    stage_routers: dict[StageKey, Router]
    admission: Admission
    shadow: ShadowRunner
    arms: ArmBook
    orchestrator: Orchestrator
    _ticker: asyncio.Task[None] | None = field(default=None, init=False)

    def changing_live(self, what: str) -> None:
        """Refuse a live change (FAILED_PRECONDITION) where it would reach one of several
        gateway processes (gateway.processes): each keeps its own state."""
        count = self.settings.gateway.processes
        if count > 1:
            raise NotReady(
                f"{what} would reach one of this gateway's {count} processes "
                "(gateway.processes), each with its own state: change the config file and "
                "Reload (every process re-reads it), or run one process"
            )

    def router(self, pipeline: str) -> Router:
        try:
            return self.routers[pipeline]
        except KeyError:
            raise NotFound(
                f"unknown pipeline {shown(pipeline)}; pipelines: {listed(self.routers)}"
            ) from None

    def start(self) -> None:
        """Start deciding the degradation level once per tick, and probing the door for it;
        in one of several gateway processes, re-read the config file on SIGHUP
        (strata.process.workers)."""
        self._ticker = asyncio.create_task(self._tick_forever())
        self.door_probe.start()
        if sharing():
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._reread)

    def _reread(self) -> None:
        try:
            self.reload()
        except StrataError as exc:  # what a Reload call would have answered, in the log
            log.warning("config not reloaded on SIGHUP: %s", exc)

    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            tick = self.ladder.settings.tick_seconds
            due = loop.time() + tick
            await asyncio.sleep(tick)
            self.ladder.signals.loop_lag = max(0.0, loop.time() - due)
            self.ladder.tick()

    async def close(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        await self.door_probe.close()
        await self.orchestrator.close()
        await self.shadow.close()
        await self.upstreams.close()

    def level_name(self) -> str:
        return LEVELS[self.ladder.level]

    def reload(self) -> tuple[list[str], list[str], list[str]]:
        """Re-read the config file: (what was applied, [], live weights kept) or
        ([], what needs a restart, []).

        Weights set live (SetWeights) win over a file whose weights for that pipeline did not
        change since the last load, and are reported kept; an edit of the file's weights wins
        over them (the operator changed the file on purpose).

        A file that is not valid config is FAILED_PRECONDITION, and weights that cannot
        route are INVALID_ARGUMENT, each naming what is wrong; nothing is applied then either.
        """
        if self.settings.source is None:
            raise NotFound("these settings were not loaded from a file")
        try:
            new = load_settings(self.settings.source, "gateway")
        except ConfigError as exc:
            raise NotReady(f"config not reloaded, nothing applied: {exc}") from None
        restart = _needs_restart(self.settings, new)
        if restart:
            log.warning("config not reloaded, nothing applied: %s need a restart", restart)
            return [], restart, []
        for name, router in self.routers.items():
            router.weighted(_weights(new, name))  # refuses before anything changes
        kept = self._live_weights_kept(new)
        applied = (
            self._apply_gateway(new)
            + self._apply_pipelines(new)
            + _apply_telemetry(self.settings, new)
        )
        self.settings = new
        log.info("config reloaded: applied %s; kept live %s", applied, kept)
        return applied, [], kept

    def _live_weights_kept(self, new: Settings) -> list[str]:
        """Pipelines whose live weights differ from a file whose weights did not change."""
        return [
            f"pipelines.{name}.routes.weight"
            for name, router in self.routers.items()
            if _weights(new, name) == _weights(self.settings, name)
            and _weights(new, name) != {route.arm: route.weight for route in router.routes}
        ]

    def _apply_gateway(self, new: Settings) -> list[str]:
        old, gateway = self.settings.gateway, new.gateway
        changed = sorted(key for key in LIVE_GATEWAY if getattr(old, key) != getattr(gateway, key))
        self.admission.configure(new)
        self.ladder.configure(gateway.ladder, objectives(new))
        self.cache.configure(gateway.cache)
        self.upstreams.configure(gateway)
        self.orchestrator.configure_flights(gateway.flights, self.upstreams.message_limit)
        return [f"gateway.{key}" for key in changed]

    def _apply_pipelines(self, new: Settings) -> list[str]:
        applied = []
        for name, router in self.routers.items():
            weights = _weights(new, name)
            if weights != _weights(self.settings, name):
                router.set_weights(weights)
                applied.append(f"pipelines.{name}.routes.weight")
            old, fresh = self.settings.pipelines[name], new.pipelines[name]
            applied += [
                f"pipelines.{name}.{key}"
                for key in LIVE_PIPELINE
                if getattr(old, key) != getattr(fresh, key)
            ]
        return applied


def _apply_telemetry(old: Settings, new: Settings) -> list[str]:
    """A new share of traces sampled, from the next request (where this process samples by
    a ratio: without an OTLP endpoint, or under OTEL_TRACES_SAMPLER, nothing changes)."""
    ratio = new.telemetry.sample_ratio
    if ratio == old.telemetry.sample_ratio:
        return []
    tracing.set_sample_ratio(ratio)
    return ["telemetry.sample_ratio"]


def _weights(settings: Settings, pipeline: str) -> dict[str, float]:
    return {route.arm: route.weight for route in settings.routes(pipeline)}


def _fixed(section: object) -> object:
    """A config section less its fields that apply live (telemetry.sample_ratio)."""
    if isinstance(section, BaseModel):
        return section.model_dump(exclude=set(live_fields(type(section))))
    return section


def _needs_restart(old: Settings, new: Settings) -> list[str]:
    """Sections, gateway settings and pipeline parts that changed beyond what applies live."""
    changed = [
        key
        for key in type(old).model_fields
        if key not in ("gateway", "pipelines")
        and _fixed(getattr(old, key)) != _fixed(getattr(new, key))
    ]
    changed += [
        f"gateway.{key}"
        for key in type(old.gateway).model_fields
        if key not in LIVE_GATEWAY and getattr(old.gateway, key) != getattr(new.gateway, key)
    ]
    if (old.gateway.admin_token is None) != (new.gateway.admin_token is None):
        changed.append("gateway.admin_token")  # the admin API is registered at start, or not
    for name in sorted(set(old.pipelines) | set(new.pipelines)):
        before, after = old.pipelines.get(name), new.pipelines.get(name)
        if before is None or after is None:
            changed.append(f"pipelines.{name}")
            continue
        skip = set(LIVE_PIPELINE) | {"model"}
        for key in type(before).model_fields:
            if key not in skip and getattr(before, key) != getattr(after, key):
                changed.append(f"pipelines.{name}.{key}")
        if _routing(before) != _routing(after):
            changed.append(f"pipelines.{name}.model")
    return changed


def _routing(pipeline: Pipeline) -> tuple[object, ...]:
    """What a live reload cannot change about a pipeline's model: all but the weights."""
    model = pipeline.model
    routes = tuple((r.arm, r.deployment, r.version) for r in model.routes)
    return model.name, model.version, routes, model.shadow
