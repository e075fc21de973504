"""strata.v1.Preprocess: decode, run each request's (or flight's) pipeline, encode.

A call whose tensors lie in the caller's shared-memory slab (strata.wire.slab: the gateway's,
where this replica said it reads it) has them copied out first, on the step thread, and each
answer to a caller of this host says so (info `strata.slab`). A call with more than
`preprocess.inline_max_bytes` of tensors, or any in a slab, runs on one of the replica's
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
from strata.errors import Unavailable, shown
from strata.proto.v1 import preprocess_pb2_grpc, tensor_pb2
from strata.wire.codec import Arrays, Place
from strata.wire.slab import ASK, READS, SHARED_MEMORY, Ref, Slab, Slabs


class PreprocessServicer(ProcessService, preprocess_pb2_grpc.PreprocessServicer):
    SERVICE = "strata.v1.Preprocess"

    def __init__(
        self,
        pipelines: PreprocessPipelines,
        steps: Executor | None = None,
        inline_max_bytes: int = 0,
        max_stream_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        slab: Slab | None = None,
        slabs: Slabs | None = None,
    ) -> None:
        super().__init__(max_stream_in_flight)
        self._slab = slab
        self._slabs = slabs  # the callers' slabs this replica reads; None: it reads none
        self._pipelines = pipelines
        self._steps = steps  # None: asyncio's default pool
        self._inline_max_bytes = inline_max_bytes

    async def _process(self, request: tensor_pb2.ProcessRequest) -> tensor_pb2.ProcessResponse:
        tensors = [t for item in request.requests for t in item.tensors]
        slabbed = any(t.slab for t in tensors)
        if not slabbed and sum(len(t.data) for t in tensors) <= self._inline_max_bytes:
            return self._all(request)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._steps, self._all, request)

    def _all(self, request: tensor_pb2.ProcessRequest) -> tensor_pb2.ProcessResponse:
        """Every request of the call, its tensors out of the caller's slab first."""
        for item in request.requests:
            for tensor in item.tensors:
                if tensor.slab:
                    self._read(tensor)
        response = process_all(request, self._run, self._place)
        if self._slabs is not None and self._slab is not None:
            for item, result in zip(request.requests, response.results, strict=True):
                if item.parameters.get(ASK) == self._slab.domain:
                    result.info[ASK] = READS
        return response

    def _read(self, tensor: tensor_pb2.Tensor) -> None:
        what = f"tensor {shown(tensor.name)}"
        if self._slabs is None:
            raise Unavailable(
                f"{what}: {SHARED_MEMORY} {shown(tensor.slab)}: this replica reads no slabs "
                "(server.slab.enabled is false here)"
            )
        tensor.data = self._slabs.read(Ref.named(tensor.slab, what), what, release=False)
        tensor.ClearField("slab")

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
