"""The strata.v1 call shape: many requests in, one result each, failures kept apart.

Preprocess and postprocess both serve `Process`; this module runs one handler per request so
that one bad request fails alone and never takes down the others in the call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from strata.codec import Arrays, arrays_to_tensors, tensors_to_arrays
from strata.errors import from_code, status_of
from strata.proto.v1 import tensor_pb2 as v1

# (pipeline name, tensors, parameters) -> (tensors, info for the caller)
Handler = Callable[[str, Arrays, Mapping[str, str]], tuple[Arrays, dict[str, str]]]


def process_all(request: v1.ProcessRequest, handler: Handler) -> v1.ProcessResponse:
    """Run `handler` on every request of the call, in order."""
    return v1.ProcessResponse(results=[_one(item, handler) for item in request.requests])


def _one(item: v1.Request, handler: Handler) -> v1.Result:
    try:
        arrays, info = handler(item.pipeline, tensors_to_arrays(item.tensors), item.parameters)
    except Exception as exc:  # each request answers for itself, bug or not
        code, message = status_of(exc)
        return v1.Result(id=item.id, error=v1.Error(code=code.value[0], message=message))
    return v1.Result(id=item.id, tensors=arrays_to_tensors(arrays), info=info)


def raise_for_result(result: v1.Result) -> Arrays:
    """The tensors of a successful result; the mapped domain error of a failed one."""
    if result.HasField("error"):
        raise from_code(result.error.code, result.error.message)
    return tensors_to_arrays(result.tensors)
