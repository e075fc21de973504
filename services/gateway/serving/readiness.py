"""Whether the server and each pipeline can answer: the layers behind healthy, and for a
pipeline each of its models (or that model's fallback) ready on one of its routes."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from services.gateway.runtime import Runtime
from services.gateway.serving.catalog import Catalog
from services.gateway.serving.counting import Counting
from strata.config.pipelines import Fallback, ModelRef, Route
from strata.proto.inference import grpc_service_pb2 as v2


class Readiness:
    def __init__(self, runtime: Runtime, catalog: Catalog, counting: Counting) -> None:
        self._runtime, self._catalog, self._counting = runtime, catalog, counting

    async def server_ready(self) -> bool:
        """Preprocess and postprocess are healthy, and every pipeline can answer (model_ready);
        under `gateway.ready_when: any_deployment`, one inference deployment is healthy."""
        states = await self._runtime.upstreams.healthy()
        if not (states["preprocess"] and states["postprocess"]):
            return False
        if self._runtime.settings.gateway.ready_when == "any_deployment":
            return any(up for name, up in states.items() if name.startswith("inference-"))
        names = self._catalog.names()
        return all(await asyncio.gather(*(self.model_ready(name) for name in names)))

    async def model_ready(self, name: str, version: str = "") -> bool:
        """Whether any route of pipeline `name` has its model ready (or its fallback on any
        of its own), and so has each later stage's model or fallback (False if no such
        pipeline, or while its last request failed by the server's fault,
        FAILED_PRECONDITION)."""
        pipeline = self._catalog.get(name, version)
        if pipeline is None or self._counting.faulted(name):
            return False
        settings = self._runtime.settings
        first = (pipeline.model, self._runtime.router(name).routes, pipeline.fallback)
        later = [(s.model, settings.model_routes(s.model), s.fallback) for s in pipeline.stages]
        for model, routes, fallback in [first, *later]:
            if not await self._either_ready(model, routes, fallback):
                return False
        return True

    async def _either_ready(
        self, model: ModelRef, routes: Sequence[Route], fallback: Fallback | None
    ) -> bool:
        """Whether `model` is ready on any of `routes`, or else its fallback on any of its own."""
        if await self._any_ready(model, routes):
            return True
        settings = self._runtime.settings
        return fallback is not None and await self._any_ready(
            fallback.model, settings.model_routes(fallback.model)
        )

    async def _any_ready(self, model: ModelRef, routes: Sequence[Route]) -> bool:
        """Whether `model` is ready on any of `routes`."""
        for route in routes:
            probe = v2.ModelReadyRequest(name=model.name, version=route.version or model.version)
            if await self._runtime.upstreams.inference[route.deployment].model_ready(probe):
                return True
        return False
