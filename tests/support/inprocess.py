"""All layers' servicers on real aio servers inside the test process, on a background loop.

For servicer and gateway tests: real gRPC over loopback, our own stubs, no child processes.
Built with the same `build(settings)` functions the services' entry points use; each
inference deployment gets its own server. Extra servers (e.g. a fault-injecting hop) can be
added on the same loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from services.gateway.app import build as build_gateway
from services.inference.app import build as build_inference
from services.postprocess.app import build as build_postprocess
from services.preprocess.app import build as build_preprocess
from strata.config import Settings, load_settings
from strata.config.endpoints import ServiceEndpoint
from strata.rpc.server import Registration, Running, start_server
from tests.support.system import make_config


@dataclass
class InProcess:
    settings: Settings
    loop: asyncio.AbstractEventLoop
    gateway: object = None
    running: list = field(default_factory=list)

    def run(self, coroutine, timeout: float = 60):
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def add_server(self, registrations: list[Registration], listen: str) -> Running:
        running = self.run(start_server(registrations, listen, self.settings.server))
        self.running.append((running, None))
        return running


@contextmanager
def servers_in_process(
    folder: Path, changes: dict | None = None, before_gateway=None
) -> Iterator[InProcess]:
    """Start every layer's server in this process; `before_gateway(world)` may add servers."""
    settings = load_settings(make_config(folder, changes))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    world = InProcess(settings, loop)

    async def start(builder, listen: str, serving: Settings = settings):
        service = await builder(serving)
        try:
            running = await start_server(
                service.registrations, listen, settings.server, settings.tls, service.public
            )
        except BaseException:
            if service.on_stop is not None:
                await service.on_stop()
            raise
        world.running.append((running, service))
        return service

    def start_each(builder, endpoint: ServiceEndpoint, serving: Settings = settings):
        """A server for each replica the config names: a caller spreads over all of them, so
        one left unstarted would send its share to whatever else takes that port."""
        return [world.run(start(builder, listen, serving)) for listen in endpoint.listens]

    services = settings.services
    try:  # a start that fails stops those before it
        for name, endpoint in services.inference.items():
            start_each(build_inference, endpoint, settings.as_deployment(name))
        start_each(build_preprocess, services.preprocess)
        start_each(build_postprocess, services.postprocess)
        if before_gateway is not None:
            before_gateway(world)
        (world.gateway,) = start_each(build_gateway, services.gateway)
        yield world
    finally:

        async def stop() -> None:
            for running, service in reversed(world.running):
                await running.stop(0)
                if service is not None and service.on_stop is not None:
                    await service.on_stop()

        world.run(stop(), timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
