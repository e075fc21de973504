"""A fault-injecting v2 hop for tests: forwards ModelInfer to a real inference server,
after a delay the test controls, or fails, or returns altered or malformed answers.
"""

from __future__ import annotations

import asyncio

import grpc
import numpy as np

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec


class FaultyInference(v2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, target: str) -> None:
        self.target = target
        self.delay = 0.0
        self.fail: grpc.StatusCode | None = None
        self.alter = False
        self.malform = False  # answer raw outputs shorter than their shapes hold
        self.calls = 0
        self._stub: v2_grpc.GRPCInferenceServiceStub | None = None

    def _upstream(self) -> v2_grpc.GRPCInferenceServiceStub:
        if self._stub is None:
            self._stub = v2_grpc.GRPCInferenceServiceStub(grpc.aio.insecure_channel(self.target))
        return self._stub

    async def ModelInfer(self, request, context):
        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.fail is not None:
            await context.abort(self.fail, "injected fault")
        reply = await self._upstream().ModelInfer(request)
        if self.malform:
            reply.raw_output_contents[0] = reply.raw_output_contents[0][:4]
        if not self.alter:
            return reply
        outputs = {k: -v for k, v in codec.response_outputs(reply).items()}
        altered = v2.ModelInferResponse(
            model_name=reply.model_name, model_version=reply.model_version, id=reply.id
        )
        codec.add_outputs(altered, {k: np.ascontiguousarray(v) for k, v in outputs.items()})
        return altered

    async def ModelReady(self, request, context):
        return await self._upstream().ModelReady(request)
