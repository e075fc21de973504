"""The entry point every service shares: `python -m services.<layer> --config FILE`."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from strata.config import ConfigError, Settings, load_settings
from strata.config.endpoints import ServiceEndpoint
from strata.metrics import serve_metrics
from strata.server import Companion, Registration, Running, serve
from strata.telemetry import setup_logging, setup_tracing

log = logging.getLogger(__name__)


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


Builder = Callable[[Settings], Awaitable[Service]]


def run_service(name: str, build: Builder, argv: list[str] | None = None) -> None:
    """Parse arguments, load the config, set up telemetry, build the service and serve it."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{name}")
    parser.add_argument("--config", type=Path, required=True, help="deployment YAML file")
    parser.add_argument(
        "--listen", help="host:port to bind instead of the config's (a replica or deployment)"
    )
    args = parser.parse_args(argv)
    try:
        settings = load_settings(args.config, name)
    except ConfigError as exc:
        sys.exit(str(exc))
    setup_logging(name, settings.telemetry.log_level)
    asyncio.run(_main(name, build, settings, args.listen))


async def _main(name: str, build: Builder, settings: Settings, listen: str | None) -> None:
    try:
        service = await build(settings)
    except (ValueError, OSError) as exc:  # a step, rule or model the config names is unusable
        log.error("cannot start: %s", exc)
        sys.exit(f"cannot start: {exc}")
    telemetry = settings.telemetry
    # A public server's callers are clients: their traceparent must not choose sampling.
    trusted = not service.public
    setup_tracing(f"strata-{name}", telemetry.otlp_endpoint, telemetry.sample_ratio, trusted)
    listen = listen or service.endpoint.listen
    endpoint = settings.services.endpoint_of(listen) or service.endpoint
    serve_metrics(endpoint.metrics_for(listen))
    try:
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
        )
    except OSError as exc:  # a port it cannot bind
        log.error("cannot start: %s", exc)
        sys.exit(f"cannot start: {exc}")
