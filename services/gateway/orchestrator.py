"""One client request through the chain: validate, preprocess, inference, postprocess."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from services.gateway.upstreams import Upstreams, call
from strata import codec
from strata.config import Pipeline
from strata.errors import DeadlineExceeded
from strata.process import raise_for_result
from strata.proto.v1 import tensor_pb2 as v1
from strata.schema import validate_inputs

Arrays = dict[str, np.ndarray]


class Budget:
    """What is left of the caller's deadline; work past it is dropped before it costs CPU."""

    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def remaining(self, hop: str) -> float:
        left = self._end - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"deadline passed before {hop}")
        return left


@dataclass
class Answer:
    outputs: Arrays
    model_version: str


class Orchestrator:
    def __init__(self, upstreams: Upstreams) -> None:
        self._up = upstreams

    async def infer(
        self, name: str, pipeline: Pipeline, arrays: Arrays, request_id: str, budget: Budget
    ) -> Answer:
        validate_inputs(arrays, pipeline.inputs, pipeline.max_batch_size)
        features = await self._process(
            "preprocess", self._up.preprocess.Process, name, request_id, arrays, budget
        )
        model = pipeline.model
        request = codec.build_request(model.name, features, model.version, request_id)
        response = await call(
            "inference", self._up.inference.ModelInfer, request, budget.remaining("inference")
        )
        scores = codec.response_outputs(response)
        outputs = await self._process(
            "postprocess", self._up.postprocess.Process, name, request_id, scores, budget
        )
        return Answer(outputs=outputs, model_version=response.model_version)

    async def _process(
        self, hop: str, rpc, pipeline: str, request_id: str, arrays: Arrays, budget: Budget
    ) -> Arrays:
        item = v1.Request(id=request_id, pipeline=pipeline, tensors=codec.arrays_to_tensors(arrays))
        reply = await call(hop, rpc, v1.ProcessRequest(requests=[item]), budget.remaining(hop))
        if len(reply.results) != 1:
            raise RuntimeError(f"{hop} answered {len(reply.results)} results for 1 request")
        return raise_for_result(reply.results[0])
