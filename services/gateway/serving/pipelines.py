"""The application service the protocols ask (api/: the gRPC servicer and the REST API
translate to it): the pipelines as the v2 models clients see, their readiness, metadata and
statistics, and inference, each request counted, answered in one response or, for a
decoupled pipeline on a stream, in several."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import grpc

from services.gateway.door.admission import Admission
from services.gateway.request import Caller
from services.gateway.serving import decoupled
from services.gateway.serving.catalog import Catalog
from services.gateway.serving.counting import Count, Counting
from services.gateway.serving.inference import Inference, Made
from services.gateway.serving.readiness import Readiness
from services.gateway.serving.responses import response
from services.gateway.serving.shared_memory import SharedMemory, write_outputs
from strata.config.pipelines import Pipeline
from strata.errors import StrataError, Upstream, shown
from strata.proto.inference import grpc_service_pb2 as v2


class Pipelines:
    def __init__(
        self,
        *,
        catalog: Catalog,
        readiness: Readiness,
        counting: Counting,
        inference: Inference,
        memory: SharedMemory,
        door: Admission,
    ) -> None:
        self._catalog, self._readiness, self._counting = catalog, readiness, counting
        self._inference, self._door = inference, door
        self.memory = memory

    def names(self) -> list[str]:
        return self._catalog.names()

    def pipeline(self, name: str, version: str = "") -> Pipeline:
        """The pipeline `name` (at `version`, when given); NOT_FOUND naming what exists."""
        return self._catalog.pipeline(name, version)

    def identify(self, caller: Caller) -> str:
        """The caller's client key (UNAUTHENTICATED without a valid API key, when required)."""
        return self._door.identify(caller)

    def server_metadata(self) -> v2.ServerMetadataResponse:
        return self._catalog.server_metadata()

    async def server_ready(self) -> bool:
        return await self._readiness.server_ready()

    async def model_ready(self, name: str, version: str = "") -> bool:
        return await self._readiness.model_ready(name, version)

    def model_metadata(self, name: str, version: str = "") -> v2.ModelMetadataResponse:
        return self._catalog.model_metadata(name, version)

    def model_config(self, name: str, version: str = "") -> v2.ModelConfigResponse:
        return self._catalog.model_config(name, version)

    def model_statistics(self, name: str = "", version: str = "") -> v2.ModelStatisticsResponse:
        return self._catalog.model_statistics(name, version)

    def counted(self, name: str, protocol: str) -> AbstractContextManager[Count]:
        """The block's request for pipeline `name`, counted (serving/counting.py)."""
        return self._counting.counted(name, protocol)

    async def infer(self, request: v2.ModelInferRequest, caller: Caller) -> v2.ModelInferResponse:
        """One inference, counted (below)."""
        with self._counting.counted(request.model_name, caller.protocol) as count:
            return count.answered(await self.answer(request, caller))

    async def answer(self, request: v2.ModelInferRequest, caller: Caller) -> v2.ModelInferResponse:
        """One inference's answer, for a unary call (ModelInfer, REST infer)."""
        return self._placed(await self._inference.made(request, caller, streamed=False))

    async def stream_answer(
        self, request: v2.ModelInferRequest, caller: Caller
    ) -> list[v2.ModelInferResponse]:
        """One request of a stream, counted: its response, or a decoupled pipeline's zero or
        more (services/gateway/serving/decoupled.py), with Triton's final flags where it
        asks."""
        name = request.model_name
        with self._counting.counted(name, caller.protocol) as count, _unavailable_named(name):
            made = await self._inference.made(request, caller, streamed=True)
            spec = made.pipeline.decoupled
            if spec is None:
                placed = self._placed(made)
                return decoupled.flagged(request, count.answered(placed), [placed], False)
            head = count.answered(response(made.request, made.answer, {}, {}))
            parts = decoupled.split(name, made.outputs, spec.max_responses)
            responses = [response(made.request, made.answer, part, {}) for part in parts]
            return decoupled.flagged(request, head, responses, True)

    def _placed(self, made: Made) -> v2.ModelInferResponse:
        """The response, its outputs written to shared memory where the client asked."""
        placed = write_outputs(self.memory, made.client, made.places, made.outputs)
        return response(made.request, made.answer, made.outputs, placed)


@contextmanager
def _unavailable_named(pipeline: str) -> Iterator[None]:
    """The block's UNAVAILABLE (a replica gone, say) naming the pipeline: on a stream that
    carries many pipelines' requests, the message is what a client's callback sees."""
    try:
        yield
    except StrataError as exc:
        if exc.code != grpc.StatusCode.UNAVAILABLE or shown(pipeline) in str(exc):
            raise
        raise Upstream(exc.code, f"pipeline {shown(pipeline)}: {exc}") from None
