"""Status codes as the report counts them: gRPC's numbers, in Go's names as ghz prints them.

An HTTP answer is counted under the gRPC code its status stands for, in the mapping of
google.rpc.Code to HTTP that the gateway's REST API (and gRPC-gateway) follow: 429 is
RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504 DEADLINE_EXCEEDED ... so one run's codes read the same
over either transport.
"""

from __future__ import annotations

import json
from http import HTTPStatus

import grpc

C = grpc.StatusCode
HTTP_CODES = {
    400: C.INVALID_ARGUMENT,
    401: C.UNAUTHENTICATED,
    403: C.PERMISSION_DENIED,
    404: C.NOT_FOUND,
    409: C.ABORTED,
    413: C.INVALID_ARGUMENT,  # the gateway's body too large
    429: C.RESOURCE_EXHAUSTED,
    499: C.CANCELLED,
    500: C.INTERNAL,
    501: C.UNIMPLEMENTED,
    503: C.UNAVAILABLE,
    504: C.DEADLINE_EXCEEDED,
}


def _go_name(code: grpc.StatusCode) -> str:
    """Go's name of a status code (codes.Code.String()), the one ghz reports."""
    special = {C.OK: "OK", C.CANCELLED: "Canceled"}
    return special.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


GO_NAMES = {code.value[0]: _go_name(code) for code in grpc.StatusCode}


def go_error(code: grpc.StatusCode, details: str | None) -> str:
    """An error as ghz (Go's status package) prints it."""
    return f"rpc error: code = {GO_NAMES[code.value[0]]} desc = {details or ''}"


def from_http(status: int) -> int:
    """The gRPC code number an HTTP status stands for: 0 for 2xx; an unlisted 5xx is INTERNAL,
    anything else unlisted UNKNOWN."""
    if 200 <= status < 300:
        return C.OK.value[0]
    default = C.INTERNAL if 500 <= status < 600 else C.UNKNOWN
    return HTTP_CODES.get(status, default).value[0]


def http_error(status: int, body: bytes) -> str:
    """A failed HTTP answer as one line: `HTTP 429 Too Many Requests: <its error message>`."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "status"
    return f"HTTP {status} {phrase}: {_message(body)}"


def _message(body: bytes) -> str:
    """The v2 REST error, {"error": "..."}; any other body (a proxy's page) as text, cut short."""
    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError):  # not JSON, or not an object
        error = None
    return error if isinstance(error, str) else body[:200].decode(errors="replace").strip()
