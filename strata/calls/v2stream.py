"""ModelStreamInfer as the gateway and the inference service both serve it.

Each request of the stream is answered on its own, in the order answers are ready, with one
response or, for a decoupled pipeline, zero or more (written together, in their order). A
failed request gets `error_message` (its status code's name, then what was wrong) and the
stream goes on, as Triton's does; the `id` a client sets tells its answers apart. At most
`max_in_flight` requests of one stream are unanswered at once; past that the stream is not
read until one is answered (strata.calls.streams).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc

from strata.calls.grpc_errors import log_failure
from strata.calls.streams import answer_each
from strata.errors import cut, status_of
from strata.proto.inference import grpc_service_pb2 as v2
from strata.telemetry.tracing import Meter

# Each request of a stream counts as a call of its own in the RPC metrics.
STREAM_METER = Meter("/inference.GRPCInferenceService/ModelStreamInfer")

# A request's responses: one, or a decoupled pipeline's zero or more.
Infer = Callable[[v2.ModelInferRequest], Awaitable[Sequence[v2.ModelInferResponse]]]


def failed_answer(
    request: v2.ModelInferRequest, code: grpc.StatusCode, detail: str
) -> v2.ModelStreamInferResponse:
    """The stream's answer for a request that failed: `CODE: what was wrong`."""
    failed = v2.ModelInferResponse(model_name=cut(request.model_name), id=cut(request.id))
    return v2.ModelStreamInferResponse(
        error_message=f"{code.name}: {detail}", infer_response=failed
    )


def _refused(request: v2.ModelInferRequest, detail: str) -> v2.ModelStreamInferResponse:
    return failed_answer(request, grpc.StatusCode.UNAVAILABLE, detail)


async def answer_stream(
    requests: AsyncIterator[v2.ModelInferRequest], infer: Infer, max_in_flight: int
) -> AsyncIterator[v2.ModelStreamInferResponse]:
    """Run `infer` on every request of the stream concurrently; yield each one's responses
    when ready."""

    async def answer(request: v2.ModelInferRequest) -> list[v2.ModelStreamInferResponse]:
        started = time.perf_counter()
        try:
            replies = await infer(request)
        except Exception as exc:  # one request's failure, reported in the stream
            code, detail = status_of(exc)
            log_failure("ModelStreamInfer", code, detail)
            STREAM_METER.record(code, time.perf_counter() - started)
            return [failed_answer(request, code, detail)]
        STREAM_METER.record(grpc.StatusCode.OK, time.perf_counter() - started)
        return [v2.ModelStreamInferResponse(infer_response=reply) for reply in replies]

    async for item in answer_each(requests, answer, _refused, max_in_flight):
        yield item
