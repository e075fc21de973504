"""REST failures: the HTTP status of every gRPC code (google.rpc's mapping), `{"error"}`
bodies, retry hints as Retry-After and retry-after-ms, and nothing leaked from a bug."""

from __future__ import annotations

import logging

import grpc
import orjson
import pytest

from services.gateway.api.rest.statuses import TooLarge, error_response, http_status
from strata.errors import (
    DeadlineExceeded,
    InvalidArgument,
    Miswired,
    NotFound,
    NotReady,
    Overloaded,
    Unauthenticated,
    Unavailable,
    Upstream,
)

# google/rpc/code.proto, each code's "HTTP Mapping", but FAILED_PRECONDITION: never the client's
# mistake here, 503 as Triton and KServe answer a model not ready (rest/statuses.py).
GOOGLE_RPC = {
    "OK": 200,
    "CANCELLED": 499,
    "UNKNOWN": 500,
    "INVALID_ARGUMENT": 400,
    "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404,
    "ALREADY_EXISTS": 409,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 401,
    "RESOURCE_EXHAUSTED": 429,
    "FAILED_PRECONDITION": 503,
    "ABORTED": 409,
    "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501,
    "INTERNAL": 500,
    "UNAVAILABLE": 503,
    "DATA_LOSS": 500,
}


def test_the_table_covers_every_grpc_code() -> None:
    assert set(GOOGLE_RPC) == {code.name for code in grpc.StatusCode}


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda code: code.name)
def test_every_grpc_code_has_google_rpcs_http_status(code: grpc.StatusCode) -> None:
    assert http_status(code) == GOOGLE_RPC[code.name]


def error_of(exc: BaseException) -> tuple[int, dict, dict[str, str]]:
    response, _ = error_response(exc, "POST /v2/models/{name}/infer")
    assert response.media_type == "application/json"
    return response.status_code, orjson.loads(response.body), dict(response.headers)


@pytest.mark.parametrize(
    ("exc", "status"),
    [
        (InvalidArgument("input 'x': bad"), 400),
        (NotFound("unknown model 'nope'"), 404),
        (NotReady("model 'm' is loading"), 503),
        (Miswired("pipeline 'p': model 'm' refused the tensors preprocess made"), 500),
        (Unauthenticated("no valid API key"), 401),
        (Unavailable("no replica"), 503),
        (DeadlineExceeded("the budget ran out"), 504),
        (Upstream(grpc.StatusCode.CANCELLED, "the client went away"), 499),
        (Upstream(grpc.StatusCode.UNIMPLEMENTED, "no such method"), 501),
        (Upstream(grpc.StatusCode.PERMISSION_DENIED, "not yours"), 403),
    ],
    ids=lambda value: type(value).__name__ if isinstance(value, Exception) else str(value),
)
def test_a_domain_error_answers_its_status_and_message(exc: Exception, status: int) -> None:
    got, document, headers = error_of(exc)
    assert got == status
    assert document == {"error": str(exc)}
    assert "retry-after" not in headers


def test_an_upstream_rpc_error_passes_on_its_code_and_details() -> None:
    metadata = grpc.aio.Metadata()
    exc = grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, metadata, metadata, "hop down")
    status, document, _ = error_of(exc)
    assert (status, document) == (503, {"error": "hop down"})


def test_overload_gives_429_with_both_retry_hints() -> None:
    status, document, headers = error_of(Overloaded("rate limit of client 'c'", retry_after=0.25))
    assert status == 429
    assert document == {"error": "rate limit of client 'c'"}
    assert headers["retry-after"] == "1"
    assert headers["retry-after-ms"] == "250"


@pytest.mark.parametrize(
    ("wait", "seconds", "milliseconds"),
    [(0.0001, "1", "1"), (1.0, "1", "1000"), (1.2, "2", "1200"), (30.0, "30", "30000")],
)
def test_retry_after_rounds_seconds_up(wait: float, seconds: str, milliseconds: str) -> None:
    _, _, headers = error_of(Overloaded("queue full", retry_after=wait))
    assert (headers["retry-after"], headers["retry-after-ms"]) == (seconds, milliseconds)


def test_overload_without_a_hint_sends_no_retry_headers() -> None:
    status, _, headers = error_of(Overloaded("concurrency limit"))
    assert status == 429
    assert "retry-after" not in headers and "retry-after-ms" not in headers


def test_an_unexpected_exception_is_500_and_leaks_nothing(caplog) -> None:
    secret = "token=hunter2 at /srv/strata/secret.py line 12"
    with caplog.at_level(logging.ERROR):
        response, code = error_response(KeyError(secret), "GET /v2")
    assert code == grpc.StatusCode.INTERNAL
    assert response.status_code == 500
    assert orjson.loads(response.body) == {
        "error": "internal error; the server log has the details"
    }
    assert b"hunter2" not in response.body and b"KeyError" not in response.body
    assert "hunter2" in caplog.text


def test_too_large_is_413_with_invalid_argument_as_its_code() -> None:
    response, code = error_response(TooLarge("the body is more than 16 bytes"), "POST /infer")
    assert response.status_code == 413
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert orjson.loads(response.body) == {"error": "the body is more than 16 bytes"}
