"""Server start-up and shutdown, one routine for every service.

Start: bind, add health, reflection (unless `server.reflection` is off) and the limits
on what clients hold open (strata.security.occupancy), add a plaintext probe port with health alone
where configured, mark SERVING. SIGTERM or SIGINT: mark NOT_SERVING, stop accepting calls, let
in-flight calls finish within the grace period, then run the service's own clean-up and flush
telemetry.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection, reflection_pb2_grpc
from grpc_reflection.v1alpha._async import ReflectionServicer
from opentelemetry import trace

from strata.calls.streams import Drain
from strata.config.server import ServerSettings, grpc_options
from strata.config.tls import TlsSettings
from strata.process.collector import Frozen
from strata.process.exits import AddressUnusable, bind_problem
from strata.process.launched import launched_by
from strata.process.workers import all_listening, sharing
from strata.rpc.pipes import PipeServer, own_folder, pipe_folder, pipe_path, piped_services
from strata.security.credentials import caller_guard, server_credentials
from strata.security.occupancy import PROBE_RESERVE, Occupancy
from strata.telemetry.metrics import set_ready
from strata.telemetry.tracing import traced_servicer

log = logging.getLogger(__name__)


class Companion(Protocol):
    """Another server in the same process and loop (the gateway's REST API): started after
    the gRPC server, drained beside it."""

    async def start(self) -> None: ...

    async def stop(self, grace: float) -> None: ...


IDENTITY_ONLY = 1  # grpc's bitset of enabled compression algorithms: bit 0, no compression


def _reuse_port() -> tuple[str, int]:
    """gRPC binds with SO_REUSEPORT by default, so a second server on a port in use would
    start and share its calls; without it, the second one fails to start and says the port
    is in use. Workers of one service share their ports on purpose (strata.process.workers), once
    their parent has claimed them."""
    return ("grpc.so_reuseport", int(sharing()))


# (servicer, add_to_server function, full service name)
Registration = tuple[object, Callable[[object, grpc.aio.Server], None], str]


@dataclass
class Running:
    """A started server and its health service."""

    server: grpc.aio.Server
    health: HealthServicer
    names: list[str]
    port: int
    # A plaintext server with only `health`, for probes that cannot present a certificate.
    probe: grpc.aio.Server | None = None

    async def set_health(self, status: int) -> None:
        set_ready(status == health_pb2.HealthCheckResponse.SERVING)  # what /readyz answers
        await self.health.set("", status)
        for name in self.names:
            await self.health.set(name, status)

    async def stop(self, grace: float) -> None:
        """Stop accepting calls and let in-flight ones finish within `grace`; probes last."""
        await self.server.stop(grace)
        if self.probe is not None:
            await self.probe.stop(0)


async def start_server(
    registrations: Iterable[Registration],
    listen: str,
    settings: ServerSettings,
    tls: TlsSettings | None = None,
    public: bool = False,
    identity: str = "",
    serving: bool = True,
    private: str | None = None,
) -> Running:
    """Bind and start a server with health (and reflection, unless off), and mark it SERVING
    (or, not `serving`, NOT_SERVING until its caller says otherwise).

    With TLS on, the server presents the certificate of `identity` (the layer's name): a public
    server (the gateway) its public one; any other requires callers to present one signed by
    the deployment's CA, and admits to its services only those `tls.allowed_clients` lists.
    `private`, a Unix socket only the process's own user can open, is bound as well, without
    TLS: its calls queue with the others (the gateway's door probe).
    """
    tls = tls or TlsSettings()
    if tls.enabled and not identity:
        raise ValueError("a server under TLS needs its identity, to pick its certificate")
    server = grpc.aio.server(
        options=_server_options(settings, public),
        maximum_concurrent_rpcs=settings.max_concurrent_rpcs + PROBE_RESERVE,
    )
    occupancy = Occupancy(
        settings.max_concurrent_rpcs, settings.max_calls_per_client if public else None
    )
    health = HealthServicer()
    health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
    guarded = occupancy.guard(health, health_name)  # the same methods, counted
    health_pb2_grpc.add_HealthServicer_to_server(guarded, server)  # type: ignore[arg-type]
    names = [health_name]
    guard = caller_guard(tls, identity, public)
    for servicer, add, name in registrations:
        add(occupancy.guard(traced_servicer(guard(servicer, name), name), name), server)
        names.append(name)
    if settings.reflection:
        reflected = ReflectionServicer([*names, reflection.SERVICE_NAME])
        reflection_pb2_grpc.add_ServerReflectionServicer_to_server(
            occupancy.guard(guard(reflected, reflection.SERVICE_NAME), reflection.SERVICE_NAME),
            server,
        )
    port = _bind(server, listen, "listen", server_credentials(tls, identity, public))
    if private is not None and server.add_insecure_port(private) == 0:
        raise AddressUnusable(private, "private")
    await server.start()
    try:
        probe = await _probe(health, tls, settings)
    except AddressUnusable:
        await server.stop(0)  # a started server left to the collector fails at exit
        raise
    running = Running(server, health, [*names, *launched_by()], port, probe)
    await running.set_health(
        health_pb2.HealthCheckResponse.SERVING
        if serving
        else health_pb2.HealthCheckResponse.NOT_SERVING
    )
    log.info("serving %s on %s", ", ".join(names[1:]), listen)
    return running


def _pipe(
    registrations: list[Registration], listen: str, settings: ServerSettings
) -> list[Companion]:
    """An internal server's stream methods on its pipe (strata.rpc.pipes), where pipes are on
    and their folder is this user's alone."""
    pipes = settings.pipes
    if not pipes.enabled:
        return []
    folder = pipe_folder(pipes.root)
    if not own_folder(folder, create=True):
        log.warning("no pipe: %s is not this user's alone (mode 0700); gRPC only", folder)
        return []
    methods = piped_services((servicer, name) for servicer, _, name in registrations)
    if not methods:
        return []
    path = pipe_path(folder, listen)
    return [PipeServer(path, listen, methods, settings.max_message_bytes, pipes.max_connections)]


def _bind(
    server: grpc.aio.Server,
    listen: str,
    role: str,
    credentials: grpc.ServerCredentials | None = None,
) -> int:
    """The port `server` bound for `listen`; AddressUnusable saying why when it cannot."""
    # Asked first: gRPC would log a line of its own. A worker's siblings listen there: its
    # parent asked instead, before any of them started.
    problem = None if sharing() else bind_problem(listen)
    if problem:
        raise AddressUnusable(listen, role, problem)
    try:
        if credentials is None:
            port = server.add_insecure_port(listen)
        else:
            port = server.add_secure_port(listen, credentials)
    except RuntimeError:  # grpc's way of saying it could not, without saying why
        port = 0
    if port == 0:
        raise AddressUnusable(listen, role)
    return port


def _server_options(settings: ServerSettings, public: bool) -> list[tuple[str, int]]:
    options = [
        *grpc_options(settings),
        ("grpc.max_concurrent_streams", settings.max_concurrent_streams),
        ("grpc.server_handshake_timeout_ms", int(settings.handshake_timeout_seconds * 1000)),
        ("grpc.http.overload_protection", int(settings.overload_protection)),
        _reuse_port(),
    ]
    if not settings.accept_compressed:
        # Identity alone: a compressed message is refused UNIMPLEMENTED before it inflates.
        options.append(("grpc.compression_enabled_algorithms_bitset", IDENTITY_ONLY))
    if public:
        options.append(
            ("grpc.max_connection_idle_ms", int(settings.idle_connection_seconds * 1000))
        )
    else:
        # Internal callers (the gateway) retry UNAVAILABLE, so ageing their connections out to
        # make them re-resolve DNS costs nothing; public clients may not retry, so theirs stay.
        options += [
            ("grpc.max_connection_age_ms", int(settings.max_connection_age_seconds * 1000)),
            ("grpc.max_connection_age_grace_ms", int(settings.grace_seconds * 1000)),
        ]
    return options


async def _probe(
    health: HealthServicer, tls: TlsSettings, settings: ServerSettings
) -> grpc.aio.Server | None:
    if not tls.probe_listen:
        return None
    probe = grpc.aio.server(options=[*grpc_options(settings), _reuse_port()])
    health_pb2_grpc.add_HealthServicer_to_server(health, probe)
    _bind(probe, tls.probe_listen, "probe")
    await probe.start()
    log.info("health probes (plaintext) on %s", tls.probe_listen)
    return probe


async def serve(
    registrations: Iterable[Registration],
    listen: str,
    settings: ServerSettings,
    on_stop: Callable[[], Awaitable[None]] | None = None,
    tls: TlsSettings | None = None,
    public: bool = False,
    on_start: Callable[[Running], Awaitable[None]] | None = None,
    identity: str = "",
    companions: Sequence[Companion] = (),
    private: str | None = None,
) -> None:
    """Run a gRPC server on `listen` (and its companions) until SIGTERM or SIGINT, then
    drain them all at once and return."""
    # SERVING once every port listens: the companions' (REST, admin) too, and with workers
    # (strata.process.workers) all the siblings'; a caller told SERVING must find each port open.
    registrations = list(registrations)
    if not public:
        pipes = _pipe(registrations, listen, settings)
        for pipe in pipes:  # first: a caller that finds the port connected finds the pipe too
            await pipe.start()
        companions = [*companions, *pipes]
    running = await start_server(
        registrations,
        listen,
        settings,
        tls,
        public,
        identity,
        serving=False,
        private=private,
    )
    try:
        for companion in companions:
            await companion.start()
        if sharing():
            await all_listening()
        await running.set_health(health_pb2.HealthCheckResponse.SERVING)
        if on_start is not None:  # after: it may add names of its own (inference's models)
            await on_start(running)
    except BaseException:  # e.g. a companion's port in use: stop what started, then say so
        await asyncio.gather(running.stop(0), *(c.stop(0) for c in companions))
        raise
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    with Frozen():  # start-up's objects out of the collector's full collections
        await stopping.wait()

    log.info("stopping: draining in-flight calls for up to %.1fs", settings.grace_seconds)
    await running.set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
    Drain.start()  # open streams refuse new messages; those in flight finish
    grace = settings.grace_seconds
    await asyncio.gather(running.stop(grace), *(c.stop(grace) for c in companions))
    if on_stop is not None:
        await on_stop()
    provider = trace.get_tracer_provider()
    if hasattr(provider, "shutdown"):
        provider.shutdown()
    log.info("stopped")
