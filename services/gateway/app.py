"""Builds the gateway: the public v2 endpoint (gRPC, and REST where configured) in front of
the layers, and its admin API (on the public port, or on `admin_listen` of its own)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from grpc_health.v1 import health_pb2

from services.gateway.api.admin import AdminServicer, admin_auth
from services.gateway.api.repository import Repository
from services.gateway.api.rest.app import build_app
from services.gateway.api.rest.server import RestServer
from services.gateway.api.server_settings import ServerSettings
from services.gateway.api.servicer import GatewayServicer
from services.gateway.door.admission import Admission
from services.gateway.door.backlog import Backlog, BacklogLimit
from services.gateway.door.concurrency import AdaptiveLimits, ChainLimit, objectives
from services.gateway.door.forced_arm import ForcedArm
from services.gateway.door.identity import Identity
from services.gateway.door.ladder import LadderController
from services.gateway.door.policy import Policy
from services.gateway.door.probe import DoorProbe
from services.gateway.door.rate_limits import RateLimit
from services.gateway.flow import measure_check
from services.gateway.flow.cache import ResultCache
from services.gateway.flow.chain import Chain
from services.gateway.flow.flights import Departed, Flights, Member
from services.gateway.flow.model_calls import ModelCalls
from services.gateway.flow.model_stages import Stages, stage_routers
from services.gateway.flow.orchestrator import Orchestrator
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.flow.sizing import Room, Sizes, arm_of
from services.gateway.runtime import Runtime, level_changed
from services.gateway.serving.catalog import Catalog
from services.gateway.serving.counting import Counting
from services.gateway.serving.inference import Inference
from services.gateway.serving.pipelines import Pipelines
from services.gateway.serving.readiness import Readiness
from services.gateway.serving.shared_memory import SharedMemory
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from services.gateway.upstream.sequences import Sequences
from services.gateway.upstream.upstreams import Upstreams
from strata.config import Settings
from strata.config.pipelines import Route
from strata.config.preprocess import per_version
from strata.config.tls import GATEWAY
from strata.process.exits import AddressUnusable
from strata.process.workers import Parent, Shared, sharing
from strata.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.rpc.main import Service
from strata.rpc.server import Companion, Registration, Running, start_server
from strata.security.credentials import KeyRing
from strata.wire import limits

log = logging.getLogger(__name__)


class AdminServer:
    """strata.v1.Admin (and health) on a port of its own, beside the public server: it
    presents the gateway's public certificate under TLS, and every call needs the token."""

    def __init__(self, admin: Registration, listen: str, settings: Settings) -> None:
        self._admin, self.listen, self._settings = admin, listen, settings
        self._running: Running | None = None

    async def start(self) -> None:
        settings = self._settings
        tls = settings.tls.model_copy(update={"probe_listen": None})  # the public server's
        try:
            self._running = await start_server(
                [self._admin], self.listen, settings.server, tls, True, GATEWAY
            )
        except AddressUnusable as exc:
            raise AddressUnusable(self.listen, "admin", exc.reason) from None

    async def stop(self, grace: float) -> None:
        """Its health NOT_SERVING (for those watching it), then drain, as the public one."""
        if self._running is not None:
            await self._running.set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            await self._running.stop(grace)


def workers(settings: Settings, listen: str | None) -> Parent | None:
    """The parent of `gateway.processes` gateway processes sharing the public ports (and the
    admin and probe ones); None for one process, or in one of the workers."""
    count = settings.gateway.processes
    if count == 1 or sharing():
        return None
    endpoint = settings.services.gateway
    listen = listen or endpoint.listen
    roles = {
        "listen": listen,
        "REST": endpoint.rest,
        "admin": endpoint.admin_listen,
        "probe": settings.tls.probe_listen,
    }
    ports = {role: address for role, address in roles.items() if address}
    shared = Shared(ports, endpoint.metrics_for(listen))
    return Parent("gateway", count, shared, settings.server.grace_seconds)


async def build(settings: Settings) -> Service:
    """The gateway as a service: its objects built (compose), its runtime started, and the
    servers of each protocol over the application service."""
    limits.install(settings.limits.plain())
    for warning in measure_check.warnings(settings.repository, settings.pipelines):
        log.warning("%s", warning)
    runtime = compose(settings)
    runtime.start()
    registrations, companions = _servers(runtime, settings)
    certificates = settings.tls.enabled and settings.tls.client_certificates
    if not runtime.admission.keys and not certificates:
        _warn_open_door(settings)
    return Service(
        registrations=registrations,
        endpoint=settings.services.gateway,
        on_stop=runtime.close,
        public=True,
        companions=companions,
        private=runtime.door_probe.address,
    )


def _servers(runtime: Runtime, settings: Settings) -> tuple[list[Registration], list[Companion]]:
    """The v2 servicer over the application service; the admin API on the public port or on
    one of its own, where a token is set; REST, where configured."""
    pipelines = serving(runtime)
    auth = admin_auth(runtime)
    repository, server_settings = Repository(runtime, auth), ServerSettings(runtime, auth)
    gateway, endpoint = settings.gateway, settings.services.gateway
    v2 = GatewayServicer(
        pipelines,
        repository,
        server_settings,
        settings.server.max_stream_in_flight,
        gateway.max_streams_per_client,
    )
    v2_name = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    add_v2 = grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server
    registrations: list[Registration] = [(v2, add_v2, v2_name)]
    companions: list[Companion] = []
    if gateway.admin_token is not None:
        admin_name = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
        admin = (
            AdminServicer(runtime, auth),
            admin_pb2_grpc.add_AdminServicer_to_server,
            admin_name,
        )
        if endpoint.admin_listen is None:
            registrations.append(admin)
        else:
            companions.append(AdminServer(admin, endpoint.admin_listen, settings))
    if endpoint.rest is not None:
        app = build_app(pipelines, repository, server_settings, gateway.rest)
        rest = RestServer(app, endpoint.rest, settings.server, settings.tls, GATEWAY, gateway.rest)
        companions.append(rest)
    return registrations, companions


def compose(settings: Settings) -> Runtime:
    """The rooms' objects, each built once, here: the upstreams, the door, the flow."""
    upstreams = Upstreams(settings)
    gateway = settings.gateway
    ladder = LadderController(gateway.ladder, objectives(settings), level_changed)
    concurrency = AdaptiveLimits(gateway.concurrency, objectives(settings), ladder.signals.refused)
    available_for = _available_for(upstreams)
    routers = _routers(settings, available_for)
    backlog = Backlog(lambda: ladder.signals.loop_lag)
    admission = _admission(settings, routers, concurrency, ladder, backlog)
    cache, shadow, arms = ResultCache(gateway.cache), ShadowRunner(upstreams), ArmBook()
    later = stage_routers(settings, available_for)
    usable = _available(upstreams)
    calls = ModelCalls(upstreams, arms, usable)
    stages = Stages(later, calls, shadow)
    margin = gateway.flights.message_margin
    sizes = Sizes(upstreams.message_limit, margin, upstreams.batch_limit)
    chain = Chain(upstreams, routers, shadow, calls, stages, sizes)
    flights = Flights(gateway.flights, chain.fly, _departed(ladder), _room(sizes), _most_in_air)
    orchestrator = Orchestrator(
        ladder=ladder,
        cache=cache,
        routers=routers,
        admission=admission,
        sizes=sizes,
        flights=flights,
        usable=usable,
    )
    return Runtime(
        settings=settings,
        upstreams=upstreams,
        ladder=ladder,
        door_probe=DoorProbe(ladder.signals, backlog, lambda: ladder.settings.tick_seconds),
        cache=cache,
        limits=concurrency,
        routers=routers,
        stage_routers=later,
        admission=admission,
        shadow=shadow,
        arms=arms,
        orchestrator=orchestrator,
    )


def serving(runtime: Runtime) -> Pipelines:
    """The application service the protocols ask, over the runtime."""
    catalog = Catalog(runtime)
    counting = Counting(catalog.has)
    memory = SharedMemory(lambda: runtime.settings.gateway.shared_memory)
    return Pipelines(
        catalog=catalog,
        readiness=Readiness(runtime, catalog, counting),
        counting=counting,
        inference=Inference(runtime, catalog, memory, Sequences()),
        memory=memory,
        door=runtime.admission,
    )


def _routers(
    settings: Settings, available_for: Callable[[str], Callable[[Route], bool]]
) -> dict[str, Router]:
    """Each pipeline's router over its first model's arms, with that model's shadow."""
    return {
        name: Router(
            name,
            settings.routes(name),
            pipeline.model.shadow,
            available_for(pipeline.model.name),
            per_version(pipeline.preprocess),
        )
        for name, pipeline in settings.pipelines.items()
    }


def _admission(
    settings: Settings,
    routers: dict[str, Router],
    concurrency: AdaptiveLimits,
    ladder: LadderController,
    backlog: Backlog,
) -> Admission:
    """The door: the caller named, then the admission policies asked in this order at their
    checkpoints (door/policy.py); the backlog's first, the cheapest refusal past capacity."""
    gateway = settings.gateway
    policies: list[Policy] = [
        BacklogLimit(backlog, concurrency, ladder.signals.arrived),
        RateLimit(settings, concurrency.refusals),
        ForcedArm(routers, KeyRing(gateway.api_keys), gateway.rate_limits.api_key_header),
        ChainLimit(concurrency, ladder, backlog.wait),
    ]
    return Admission(Identity(settings), policies)


def _available_for(upstreams: Upstreams) -> Callable[[str], Callable[[Route], bool]]:
    """Whether a route's deployment can take a model now: that model's circuit there."""
    inference = upstreams.inference

    def for_model(model: str) -> Callable[[Route], bool]:
        return lambda route: inference[route.deployment].breaker.available_for(model)

    return for_model


def _available(upstreams: Upstreams) -> Callable[[Route], bool]:
    """Whether a route's deployment takes calls now: its circuit."""
    inference = upstreams.inference
    return lambda route: inference[route.deployment].breaker.available


def _departed(ladder: LadderController) -> Departed:
    """The ladder told how long each member waited for its flight."""
    return lambda member, waited: ladder.signals.queued(member.request.pipeline_name, waited)


def _room(sizes: Sizes) -> Callable[[Member], Room]:
    """What a flight of a member's arm may carry."""
    return lambda member: sizes.room(arm_of(member.request))


def _most_in_air(member: Member) -> int | None:
    """The flights in the air beside which a member's pipeline lets its next flight leave."""
    return member.request.pipeline.max_in_air


def _warn_open_door(settings: Settings) -> None:
    """Say once, at start, that any caller is served and names itself."""
    log.warning(
        "no API keys configured (gateway.api_keys, gateway.api_keys_file) nor client "
        "certificates required (tls.client_certificates): the door is open, "
        "anyone who reaches %s can call, and a caller's identity for rate limits and fair "
        "shares is the %r header it chooses; fine on a laptop, not on a network",
        settings.services.gateway.listen,
        settings.gateway.rate_limits.client_header,
    )
