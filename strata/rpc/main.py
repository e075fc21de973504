"""The entry point every service shares: `python -m services.<layer> --config FILE`."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import uvloop

import strata.process.grpc_logs
import strata.process.transport  # noqa: F401  (first: it sets gRPC's transport before gRPC loads)
from strata.config import ConfigError, Settings, load_settings
from strata.config.endpoints import ServiceEndpoint
from strata.errors import StrataError
from strata.process.allocator import keep_tensor_memory
from strata.process.exits import (
    AddressUnusable,
    ConfigInvalid,
    ModelUnusable,
    StartFailure,
    one_line,
    refusal,
)
from strata.process.workers import Parent, sharing, worker_index
from strata.rpc.server import Companion, Registration, Running, serve
from strata.telemetry.metrics import serve_metrics
from strata.telemetry.tracing import setup_logging, setup_tracing


@dataclass
class Service:
    """What a layer hands to the shared server routine."""

    registrations: list[Registration]
    endpoint: ServiceEndpoint
    on_stop: Callable[[], Awaitable[None]] | None = field(default=None)
    # Run once the server is up, e.g. to report more on its health service.
    on_start: Callable[[Running], Awaitable[None]] | None = field(default=None)
    # Public: faces clients (TLS without client certificates); internal: mutual TLS.
    public: bool = False
    # Servers beside the gRPC one, in the same loop (the gateway's REST API).
    companions: list[Companion] = field(default_factory=list)
    # A Unix socket the server also listens on, for the service's own calls only (the
    # gateway's door probe): insecure, so it must be one no one else can open.
    private: str | None = None


Builder = Callable[[Settings], Awaitable[Service]]
# The parent of a service's several processes, for the settings and --listen; None
# where this process serves alone (strata.process.workers).
Workers = Callable[[Settings, str | None], Parent | None]


def run_service(
    name: str, build: Builder, argv: list[str] | None = None, workers: Workers | None = None
) -> None:
    """Parse arguments, load the config, set up telemetry, build the service and serve it,
    or, where `workers` gives a parent, start that many processes serving it.

    A reason it cannot start (strata.process.exits) ends it with one line on stderr, `<process>:
    <what and where>`, and that reason's exit code.
    """
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument("--config", type=Path, required=True, help="deployment YAML file")
    parser.add_argument(
        "--listen", help="host:port to bind instead of the config's (a replica or deployment)"
    )
    args = parser.parse_args(argv)
    keep_tensor_memory()
    process = name
    try:
        settings = _settings(args.config, name, args.listen)
        deployment = _deployment(name, settings)
        process = f"{name}-{deployment}" if deployment else name
        setup_logging(name, settings.telemetry.log_level, deployment, worker_index())
        parent = workers(settings, args.listen) if workers else None
        if parent is not None:
            raise SystemExit(parent.run(sys.argv[1:] if argv is None else argv))
        with asyncio.Runner(loop_factory=_loop_factory(settings)) as runner:
            runner.run(_main(name, build, settings, args.listen))
    except StartFailure as exc:
        # One write: beside other processes on a shared, unbuffered stderr, print's two
        # writes (text, then newline) may have another's line between them.
        sys.stderr.write(f"{process}: {exc}\n")
        raise SystemExit(exc.code) from None


def _loop_factory(settings: Settings) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The event loop the config names (None: asyncio's own)."""
    return uvloop.new_event_loop if settings.server.event_loop == "uvloop" else None


def _settings(path: Path, name: str, listen: str | None) -> Settings:
    try:
        return load_settings(path, name, listen)
    except ConfigError as exc:
        raise ConfigInvalid(one_line(str(exc))) from None


def _deployment(name: str, settings: Settings) -> str | None:
    """The inference deployment an inference process serves (`inference-a` to the operator,
    and in its logs, traces and metrics); None for the other layers."""
    return settings.deployment if name == "inference" else None


async def _main(name: str, build: Builder, settings: Settings, listen: str | None) -> None:
    service = await _built(build, settings)
    telemetry = settings.telemetry
    # A public server's callers are clients: their traceparent must not choose sampling.
    trusted = not service.public
    setup_tracing(
        f"strata-{name}",
        telemetry.otlp_endpoint,
        telemetry.sample_ratio,
        trusted,
        _deployment(name, settings),
    )
    listen = listen or service.endpoint.listen
    endpoint = settings.services.endpoint_of(listen) or service.endpoint
    if not sharing():  # a worker's metrics go to its parent's page
        _serve_metrics(endpoint.metrics_for(listen))
    await serve(
        service.registrations,
        listen,
        settings.server,
        service.on_stop,
        settings.tls,
        service.public,
        service.on_start,
        identity=name,
        companions=service.companions,
        private=service.private,
    )


async def _built(build: Builder, settings: Settings) -> Service:
    try:
        return await build(settings)
    except StartFailure:
        raise
    except (ValueError, OSError, StrataError) as exc:  # a model, step or rule is unusable
        raise ModelUnusable(one_line(str(exc))) from None


def _serve_metrics(address: str | None) -> None:
    try:
        serve_metrics(address)
    except OSError as exc:
        raise AddressUnusable(str(address), "metrics", refusal(exc)) from None
