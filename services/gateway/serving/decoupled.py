"""A decoupled pipeline's answer as its responses on ModelStreamInfer (Triton's decoupled
transaction policy), and the final-response flags Triton's clients may ask for.

The chain runs once per request, as for any pipeline; only its answer is split: each output
has a leading response axis of one length k, and response i carries each output's row i
(of the shape the output declares). A request whose answer has more than the pipeline's
`decoupled.max_responses` responses fails, so what one request of a stream can make the
gateway hold is bounded (strata.calls.streams counts the stream's room per request).
"""

from __future__ import annotations

from collections.abc import Sequence

from strata.errors import InvalidArgument, NotReady, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

# Triton's: a request that sets ENABLE_EMPTY_FINAL gets FINAL on each response, true only
# on the last (for a decoupled pipeline an empty one after its data responses).
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"


def unary_refused(pipeline: str) -> InvalidArgument:
    """The answer to ModelInfer or REST infer on a decoupled pipeline (Triton's words)."""
    return InvalidArgument(
        "unary inference (ModelInfer, REST infer) doesn't support models with decoupled "
        f"transaction policy: pipeline {shown(pipeline)} answers each request with zero or "
        "more responses; send its requests on the gRPC stream ModelStreamInfer"
    )


def split(pipeline: str, outputs: codec.Arrays, max_responses: int) -> list[codec.Arrays]:
    """The answer's responses: response i has each output's row i. NotReady (the pipeline
    does not make what it declares) where the outputs disagree on their count;
    InvalidArgument past `max_responses`."""
    counts: dict[str, int | None] = {
        name: array.shape[0] if array.ndim else None for name, array in outputs.items()
    }
    count = next(iter(counts.values()), 0)
    if count is None or len(set(counts.values())) > 1:
        raise NotReady(
            f"pipeline {shown(pipeline)} is decoupled, but its outputs do not share a leading "
            f"response dimension (their lengths: {counts}); each output needs one"
        )
    if count > max_responses:
        raise InvalidArgument(
            f"the answer of pipeline {shown(pipeline)} to this request has {count} responses, "
            f"more than the {max_responses} it may send for one request "
            "(decoupled.max_responses)"
        )
    return [{name: array[i] for name, array in outputs.items()} for i in range(count)]


def wants_final(request: v2.ModelInferRequest) -> bool:
    """Whether the request asks for Triton's final-response flags."""
    flag = request.parameters.get(ENABLE_EMPTY_FINAL)
    return flag is not None and flag.bool_param


def flagged(
    request: v2.ModelInferRequest,
    head: v2.ModelInferResponse,
    responses: Sequence[v2.ModelInferResponse],
    decoupled: bool,
) -> list[v2.ModelInferResponse]:
    """`responses` as the stream sends them. Where the request asks for final flags: a
    decoupled pipeline's each marked not final, then `head` (no outputs) marked final; any
    other pipeline's one response marked final itself."""
    if not wants_final(request):
        return list(responses)
    if not decoupled:
        for response in responses:
            response.parameters[FINAL].bool_param = True
        return list(responses)
    for response in responses:
        response.parameters[FINAL].bool_param = False
    head.parameters[FINAL].bool_param = True
    return [*responses, head]
