"""The composition root (services/gateway/app.py): each object built once and handed to
every room that needs it, so that what the admin API changes (a router's weights, the
ladder's level, the cache) is what requests meet."""

import asyncio

from services.gateway.app import compose, serving
from services.gateway.request import Caller
from strata.config import load_settings
from tests.support.system import DEFAULT_CONFIG


def test_the_rooms_share_the_objects_built_once() -> None:
    async def composed() -> None:
        settings = load_settings(DEFAULT_CONFIG)
        runtime = compose(settings)
        try:
            orchestrator = runtime.orchestrator
            assert orchestrator.routers is runtime.routers
            assert set(runtime.routers) == set(settings.pipelines)
            assert orchestrator.ladder is runtime.ladder and orchestrator.cache is runtime.cache
            assert orchestrator.admission is runtime.admission
            pipelines = serving(runtime)
            assert pipelines.names() == sorted(settings.pipelines)
            anyone = Caller({}, "ipv4:127.0.0.1:5000", None)
            assert pipelines.identify(anyone) == "peer:ipv4:127.0.0.1"  # the door is open
        finally:
            await runtime.close()

    asyncio.run(composed())
