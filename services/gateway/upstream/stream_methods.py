"""How each hop's call travels as a message on a lane (services/gateway/upstream/lanes.py).

- strata.v1 `Process` as `ProcessStream`: the message's tag in `ProcessRequest.tag`, and the
  trace context a unary call carries in its metadata (which a stream sends once) in
  `ProcessRequest.trace_context`.
- v2 `ModelInfer` as `ModelStreamInfer`: the tag before the first `#` of the request id,
  which every v2 server echoes (a long id is cut at its end); the call's traceparent in
  `strata.trace_context` (strata.wire.flight); a lone request's time budget in v2's `timeout`
  parameter (a flight's members carry their own); a failed answer's `error_message` starts
  with its status code's name (strata.calls.v2stream), else it counts as UNKNOWN.
"""

from __future__ import annotations

import grpc

from services.gateway.upstream.lanes import Metadata, StreamMethod, rpc_error
from services.gateway.upstream.stubs import InferenceStub, ProcessStub
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.flight import is_flight, set_call_traceparent

# v2's own per-request time budget in microseconds (Triton's too).
TIMEOUT = "timeout"
TRACE_KEYS = ("traceparent", "tracestate")
_CODES = {code.value[0]: code for code in grpc.StatusCode}
_NAMES = {code.name: code for code in grpc.StatusCode}


ProcessStream = StreamMethod[v1.ProcessRequest, v1.ProcessResponse, v1.ProcessResponse]
InferStream = StreamMethod[v2.ModelInferRequest, v2.ModelStreamInferResponse, v2.ModelInferResponse]


def process_stream(stub: ProcessStub) -> ProcessStream:
    return ProcessStream(
        stub.ProcessStream,
        "ProcessStream",
        v1.ProcessResponse,
        _tag_process,
        _process_tag,
        _process_result,
    )


def infer_stream(stub: InferenceStub) -> InferStream:
    return InferStream(
        stub.ModelStreamInfer,
        "ModelStreamInfer",
        v2.ModelStreamInferResponse,
        _tag_infer,
        _infer_tag,
        _infer_result,
    )


def _tag_process(
    request: v1.ProcessRequest, tag: int, timeout: float, metadata: Metadata
) -> v1.ProcessRequest:
    request.tag = tag
    for key, value in metadata:
        if key in TRACE_KEYS:
            request.trace_context[key] = value
    return request


def _process_tag(reply: v1.ProcessResponse) -> int:
    return reply.tag


def _process_result(reply: v1.ProcessResponse) -> v1.ProcessResponse:
    if reply.HasField("error"):
        code = _CODES.get(reply.error.code, grpc.StatusCode.UNKNOWN)
        raise rpc_error(code, reply.error.message)
    return reply


def _tag_infer(
    request: v2.ModelInferRequest, tag: int, timeout: float, metadata: Metadata
) -> v2.ModelInferRequest:
    parameters = request.parameters
    traceparent = next((value for key, value in metadata if key == "traceparent"), "")
    set_call_traceparent(parameters, traceparent)
    if not is_flight(parameters):
        parameters[TIMEOUT].int64_param = max(1, int(timeout * 1e6))
    request.id = f"{tag}#{request.id}"
    return request


def _infer_tag(reply: v2.ModelStreamInferResponse) -> int | None:
    tag, _, _ = reply.infer_response.id.partition("#")
    return int(tag) if tag.isdigit() else None


def _infer_result(reply: v2.ModelStreamInferResponse) -> v2.ModelInferResponse:
    if reply.error_message:
        name, _, detail = reply.error_message.partition(": ")
        code = _NAMES.get(name)
        if code is None:
            raise rpc_error(grpc.StatusCode.UNKNOWN, reply.error_message)
        raise rpc_error(code, detail)
    return reply.infer_response
