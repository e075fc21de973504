"""strata.v1.Preprocess: decode, run each request's (or flight's) pipeline, encode.

A call with more than `preprocess.inline_max_bytes` of tensors runs on one of the replica's
`preprocess.threads` step threads, one hand-off per call: decoding a large image or
tokenising a long batch must not hold up the event loop, and with it every other call and the
health checks. A smaller call runs on the loop, since the hand-off would cost more than its
steps. A flight's steps run once over its
stacked rows (strata.calls.v1process has the mechanism). The request's `model_version` parameter
(the version its arm calls) picks the pipeline's build for pipelines fed per version.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor

from services.preprocess.pipeline import PreprocessPipelines
from services.preprocess.versions import MODEL_VERSION
from strata.calls.streams import DEFAULT_MAX_IN_FLIGHT
from strata.calls.v1process import process_all
from strata.calls.v1stream import ProcessService
from strata.proto.v1 import preprocess_pb2_grpc, tensor_pb2
from strata.wire.codec import Arrays, Place
from strata.wire.slab import ASK, Slab


class PreprocessServicer(ProcessService, preprocess_pb2_grpc.PreprocessServicer):
    SERVICE = "strata.v1.Preprocess"

    def __init__(
        self,
        pipelines: PreprocessPipelines,
        steps: Executor | None = None,
        inline_max_bytes: int = 0,
        max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        slab: Slab | None = None,
    ) -> None:
        super().__init__(max_stream_in_flight)
        self._slab = slab
        self._pipelines = pipelines
        self._steps = steps  # None: asyncio's default pool
        self._inline_max_bytes = inline_max_bytes

    async def _process(self, request: tensor_pb2.ProcessRequest) -> tensor_pb2.ProcessResponse:
        size = sum(len(t.data) for item in request.requests for t in item.tensors)
        if size <= self._inline_max_bytes:
            return process_all(request, self._run, self._place)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._steps, process_all, request, self._run, self._place)

    def _place(self, item: tensor_pb2.Request) -> Place | None:
        """The slab for a caller of this host that asked for it (strata.wire.slab)."""
        if self._slab is None or ASK not in item.parameters:
            return None
        return self._slab.offered(item.parameters[ASK])

    def _run(
        self, pipeline: str, tensors: Arrays, parameters: Mapping[str, str]
    ) -> tuple[Arrays, dict[str, str]]:
        version = parameters.get(MODEL_VERSION, "")
        return self._pipelines.get(pipeline, version).run(tensors), {}
