"""All four servicers on real aio servers inside the test process, on a background loop.

For servicer tests: real gRPC over loopback, our own stubs, no child processes. Built with the
same `build(settings)` functions the services' entry points use.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from services.gateway.app import build as build_gateway
from services.inference.app import build as build_inference
from services.postprocess.app import build as build_postprocess
from services.preprocess.app import build as build_preprocess
from strata.config import Settings, load_settings
from strata.server import start_server
from tests.support.system import make_config

BUILDERS = {
    "inference": build_inference,
    "preprocess": build_preprocess,
    "postprocess": build_postprocess,
    "gateway": build_gateway,
}


@contextmanager
def servers_in_process(folder: Path, changes: dict | None = None) -> Iterator[Settings]:
    """Start every layer's server in this process; yields the settings with their addresses."""
    settings = load_settings(make_config(folder, changes))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def start() -> list:
        started = []
        for builder in BUILDERS.values():
            service = await builder(settings)
            running = await start_server(
                service.registrations, service.endpoint.listen, settings.server
            )
            started.append((running, service))
        return started

    started = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=60)
    try:
        yield settings
    finally:

        async def stop() -> None:
            for running, service in reversed(started):
                await running.server.stop(0)
                if service.on_stop is not None:
                    await service.on_stop()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
