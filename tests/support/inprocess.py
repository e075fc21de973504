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

    async def start(builder, listen: str | None = None, serving: Settings = settings):
        service = await builder(serving)
        running = await start_server(
            service.registrations,
            listen or service.endpoint.listen,
            settings.server,
            settings.tls,
            service.public,
        )
        world.running.append((running, service))
        return service

    for name, endpoint in settings.services.inference.items():
        world.run(start(build_inference, endpoint.listen, settings.as_deployment(name)))
    world.run(start(build_preprocess))
    world.run(start(build_postprocess))
    if before_gateway is not None:
        before_gateway(world)
    world.gateway = world.run(start(build_gateway))
    try:
        yield world
    finally:

        async def stop() -> None:
            for running, service in reversed(world.running):
                await running.server.stop(0)
                if service is not None and service.on_stop is not None:
                    await service.on_stop()

        world.run(stop(), timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
