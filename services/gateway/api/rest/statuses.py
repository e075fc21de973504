"""Failures as the v2 REST protocol reports them: `{"error": "..."}` with the HTTP status of
the gRPC code, as google.rpc maps them (400, 401, 403, 404, 429, 499, 501, 503, 504; 500
only for a bug), and a retry hint as `Retry-After` (whole seconds) and `retry-after-ms`.

One departure: FAILED_PRECONDITION is 503, not google.rpc's 400. Here it never means the
client erred: it is a model not loaded or not ready (Triton answers that 503 over HTTP, its
UNAVAILABLE; KServe's ModelNotReady is 503 too), a pipeline whose rules do not make what it
declares, a setting this deployment lacks. It crosses a hop as a bare code, so which of
these it was is not known here; an error that knows it is a lasting mistake of the
deployment says so with its own `http_status` (strata.errors.Miswired: 500).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import grpc
import orjson
from starlette.responses import Response

from strata.calls.grpc_errors import log_failure
from strata.errors import RETRY_AFTER, InvalidArgument, retry_after_of, status_of

JSON = "application/json"
_HTTP = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 503,  # see the module's docstring
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
}


class TooLarge(InvalidArgument):
    """A body over the size limit: 413, where gRPC would refuse the message outright."""

    http_status = 413


def http_status(code: grpc.StatusCode) -> int:
    return _HTTP.get(code, 500)


def json_response(
    document: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(orjson.dumps(document), status, headers, media_type=JSON)


def error_response(exc: BaseException, method: str) -> tuple[Response, grpc.StatusCode]:
    """The protocol's error answer for any exception, logged as gRPC failures are."""
    code, message = status_of(exc)
    log_failure(method, code, message)
    status = getattr(exc, "http_status", None) or http_status(code)
    response = json_response({"error": message}, status)
    wait = retry_after_of(exc)
    if wait > 0:
        response.headers["retry-after"] = str(max(1, math.ceil(wait)))
        response.headers[RETRY_AFTER] = str(max(1, round(wait * 1000)))
    return response, code
