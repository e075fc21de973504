"""Builds the gateway: the public v2 endpoint (gRPC, and REST where configured) in front of
the layers, and its admin API (on the public port, or on `admin_listen` of its own)."""

from __future__ import annotations

import logging

from grpc_health.v1 import health_pb2

from services.gateway.api.admin import AdminServicer, admin_auth
from services.gateway.api.pipelines import Pipelines
from services.gateway.api.repository import Repository
from services.gateway.api.rest.app import build_app
from services.gateway.api.rest.server import RestServer
from services.gateway.api.server_settings import ServerSettings
from services.gateway.api.servicer import GatewayServicer
from services.gateway.flow import measure_check
from services.gateway.runtime import Runtime
from strata import limits
from strata.cli import Service
from strata.config import Settings
from strata.config.tls import GATEWAY
from strata.exits import AddressUnusable
from strata.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.server import Registration, Running, start_server
from strata.workers import Parent, Shared, sharing

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
    limits.install(settings.limits.plain())
    for warning in measure_check.warnings(settings.repository, settings.pipelines):
        log.warning("%s", warning)
    runtime = Runtime(settings)
    runtime.start()
    pipelines = Pipelines(runtime)
    auth = admin_auth(runtime)
    repository = Repository(runtime, auth)
    server_settings = ServerSettings(runtime, auth)
    v2_name = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    registrations: list[Registration] = [
        (
            GatewayServicer(
                pipelines,
                repository,
                server_settings,
                settings.server.max_stream_in_flight,
                settings.gateway.max_streams_per_client,
            ),
            grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
            v2_name,
        )
    ]
    endpoint = settings.services.gateway
    companions = []
    if settings.gateway.admin_token is not None:
        admin_name = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
        servicer = AdminServicer(runtime, auth)
        admin = (servicer, admin_pb2_grpc.add_AdminServicer_to_server, admin_name)
        if endpoint.admin_listen is None:
            registrations.append(admin)
        else:
            companions.append(AdminServer(admin, endpoint.admin_listen, settings))
    if endpoint.rest is not None:
        rest = settings.gateway.rest
        server = RestServer(
            build_app(pipelines, repository, server_settings, rest),
            endpoint.rest,
            settings.server,
            settings.tls,
            GATEWAY,
            rest,
        )
        companions.append(server)
    certificates = settings.tls.enabled and settings.tls.client_certificates
    if not runtime.admission.keys and not certificates:
        _warn_open_door(settings)
    return Service(
        registrations=registrations,
        endpoint=endpoint,
        on_stop=runtime.close,
        public=True,
        companions=companions,
        private=runtime.door_probe.address,
    )


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
