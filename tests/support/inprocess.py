"""All layers' servicers on real aio servers inside the test process, on a background loop.

For servicer and gateway tests: real gRPC over loopback, our own stubs, no child processes.
Built with the same `build(settings)` functions the services' entry points use; each
replica the config names (each inference deployment's too) gets its own server. Extra
servers (e.g. a fault-injecting hop) can be added on the same loop.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from services.gateway.app import build as build_gateway
from services.inference.app import build as build_inference
from services.postprocess.app import build as build_postprocess
from services.preprocess.app import build as build_preprocess
from strata.config import Settings, load_settings
from strata.config.endpoints import ServiceEndpoint
from strata.process.exits import AddressUnusable
from strata.rpc.server import Registration, Running, start_server
from strata.tools.launch import START_ATTEMPTS
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

    def start_all(self, before_gateway: Callable[[InProcess], None] | None) -> None:
        """Every layer's servers; `before_gateway(self)` may add servers before the gateway's."""
        services = self.settings.services
        for name, endpoint in services.inference.items():
            self._start_each(build_inference, endpoint, self.settings.as_deployment(name))
        self._start_each(build_preprocess, services.preprocess)
        self._start_each(build_postprocess, services.postprocess)
        if before_gateway is not None:
            before_gateway(self)
        (self.gateway,) = self._start_each(build_gateway, services.gateway)

    def stop_all(self) -> None:
        async def stop() -> None:
            for running, service in reversed(self.running):
                await running.stop(0)
                if service is not None and service.on_stop is not None:
                    await service.on_stop()

        self.run(stop(), timeout=30)
        self.running.clear()

    def _start_each(self, builder, endpoint: ServiceEndpoint, serving: Settings | None = None):
        """A server for each replica the config names: a caller spreads over all of them, so
        one left unstarted would send its share to whatever else takes that port."""
        return [self.run(self._start(builder, listen, serving)) for listen in endpoint.listens]

    async def _start(self, builder, listen: str, serving: Settings | None):
        service = await builder(serving or self.settings)
        try:
            running = await start_server(
                service.registrations,
                listen,
                self.settings.server,
                self.settings.tls,
                service.public,
            )
        except BaseException:
            if service.on_stop is not None:
                await service.on_stop()
            raise
        self.running.append((running, service))
        return service


@contextmanager
def servers_in_process(
    folder: Path,
    changes: dict | Callable[[], dict] | None = None,
    before_gateway: Callable[[InProcess], None] | None = None,
) -> Iterator[InProcess]:
    """Start every layer's server in this process; `before_gateway(world)` may add servers.

    The ports are chosen free, then bound a moment later: another process may take one in
    between. A start that loses a port is stopped and tried again on new ports (`changes`,
    where it is a function, is asked again), as running_system does with processes."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        world = _started(folder, changes, before_gateway, loop)
        try:
            yield world
        finally:
            world.stop_all()
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)


def _started(folder, changes, before_gateway, loop: asyncio.AbstractEventLoop) -> InProcess:
    attempt = 1
    while True:
        config = make_config(folder, changes() if callable(changes) else changes)
        world = InProcess(load_settings(config), loop)
        try:
            world.start_all(before_gateway)
            return world
        except BaseException as exc:
            world.stop_all()
            if not isinstance(exc, AddressUnusable) or attempt == START_ATTEMPTS:
                raise
        attempt += 1
