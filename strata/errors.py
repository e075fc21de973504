"""One error hierarchy and one mapping to gRPC status codes, for every hop.

Domain code raises these; servicers wrap their methods with `grpc_errors`, which turns them
into statuses. An unexpected exception becomes a generic INTERNAL that leaks no internals.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc

log = logging.getLogger(__name__)


class StrataError(Exception):
    """An error whose message is safe to show the caller."""

    code = grpc.StatusCode.INTERNAL


class InvalidArgument(StrataError):
    """The request is malformed; retrying it unchanged cannot succeed."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(StrataError):
    """No such pipeline, model or version."""

    code = grpc.StatusCode.NOT_FOUND


class NotReady(StrataError):
    """The model exists but cannot serve yet (loading, or failed validation)."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Overloaded(StrataError):
    """A rate limit or a full queue; the caller should back off."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(StrataError):
    """This replica cannot answer now; another one may."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(StrataError):
    """The caller's time budget ran out before the work could be done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Upstream(StrataError):
    """A status returned by the next hop, passed on unchanged to our caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


_BY_CODE = {cls.code: cls for cls in StrataError.__subclasses__() if cls is not Upstream}


def from_code(code: int | grpc.StatusCode, message: str) -> StrataError:
    """The domain error for a status code (as carried in a strata.v1 Error)."""
    status = code if isinstance(code, grpc.StatusCode) else _status_of(code)
    known = _BY_CODE.get(status)
    return known(message) if known else Upstream(status, message)


def _status_of(value: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == value:
            return status
    return grpc.StatusCode.UNKNOWN


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and caller-safe message for any exception."""
    if isinstance(exc, StrataError):
        return exc.code, str(exc)
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code(), exc.details() or exc.code().name
    log.exception("unexpected error", exc_info=exc)
    return grpc.StatusCode.INTERNAL, "internal error; the server log has the details"


T = TypeVar("T")
Handler = Callable[..., Awaitable[T]]


def grpc_errors(method: Handler[T]) -> Handler[T]:
    """Wrap a unary aio servicer method: exceptions become the mapped gRPC status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext) -> T:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # every failure must reach the caller as a status
            code, message = status_of(exc)
            await context.abort(code, message)
            raise AssertionError("unreachable") from exc

    return wrapper
