"""The strata.v1 call shape: many requests in, one result each, failures kept apart.

Preprocess and postprocess both serve `Process`; this module runs one handler per request so
that one bad request fails alone and never takes down the others in the call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping

from opentelemetry import propagate, trace
from opentelemetry.trace import Link

from strata.codec import Arrays, arrays_to_tensors, tensors_to_arrays
from strata.errors import from_code, status_of
from strata.proto.v1 import tensor_pb2 as v1

TRACER = trace.get_tracer("strata.process")
# (pipeline name, tensors, parameters) -> (tensors, info for the caller)
Handler = Callable[[str, Arrays, Mapping[str, str]], tuple[Arrays, dict[str, str]]]


def process_all(request: v1.ProcessRequest, handler: Handler) -> v1.ProcessResponse:
    """Run `handler` on every request of the call, in order."""
    return v1.ProcessResponse(results=[_one(item, handler) for item in request.requests])


def _one(item: v1.Request, handler: Handler) -> v1.Result:
    with in_own_trace(item):
        try:
            arrays, info = handler(item.pipeline, tensors_to_arrays(item.tensors), item.parameters)
        except Exception as exc:  # each request answers for itself, bug or not
            return failed(item, exc)
    return v1.Result(id=item.id, tensors=arrays_to_tensors(arrays), info=info)


def failed(item: v1.Request, exc: Exception) -> v1.Result:
    """The result of a request whose handler raised: its status code and message."""
    code, message = status_of(exc)
    return v1.Result(id=item.id, error=v1.Error(code=code.value[0], message=message))


@contextlib.contextmanager
def in_own_trace(item: v1.Request) -> Iterator[None]:
    """For a request that came with its own trace context (a call carrying requests of
    several traces), a span of its own in that trace, linked to the call's: the spans of the
    work done for it nest there. Nothing for a request of the call's own trace."""
    if not item.trace_context:
        yield
        return
    call = trace.get_current_span().get_span_context()
    with TRACER.start_as_current_span(
        f"request {item.pipeline}",
        context=propagate.extract(item.trace_context),
        links=[Link(call)] if call.is_valid else [],
        attributes={"strata.pipeline": item.pipeline},
    ):
        yield


def raise_for_result(result: v1.Result) -> Arrays:
    """The tensors of a successful result; the mapped domain error of a failed one."""
    if result.HasField("error"):
        raise from_code(result.error.code, result.error.message)
    return tensors_to_arrays(result.tensors)
