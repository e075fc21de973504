"""Failures as callers and operators see them: a servicer's exceptions become statuses, and
each failed call is logged with its kind and recorded on its span."""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc

from strata.errors import StrataError, Unimplemented, status_of
from strata.telemetry.tracing import record_error

log = logging.getLogger(__name__)

# How each failure is reported: its kind (for logs and span events) and log level.
# Client mistakes are routine (INFO); overload is counted in metrics, not logged per request.
_KINDS = {
    grpc.StatusCode.INVALID_ARGUMENT: ("client", logging.INFO),
    grpc.StatusCode.NOT_FOUND: ("client", logging.INFO),
    grpc.StatusCode.FAILED_PRECONDITION: ("client", logging.INFO),
    grpc.StatusCode.UNAUTHENTICATED: ("client", logging.INFO),
    grpc.StatusCode.PERMISSION_DENIED: ("client", logging.INFO),
    grpc.StatusCode.UNIMPLEMENTED: ("client", logging.INFO),
    grpc.StatusCode.RESOURCE_EXHAUSTED: ("overload", logging.DEBUG),
    grpc.StatusCode.UNAVAILABLE: ("retryable", logging.WARNING),
    grpc.StatusCode.DEADLINE_EXCEEDED: ("deadline", logging.WARNING),
    grpc.StatusCode.CANCELLED: ("cancelled", logging.DEBUG),
}


def error_kind(code: grpc.StatusCode) -> str:
    """client, overload, retryable, deadline, cancelled or internal."""
    return _KINDS.get(code, ("internal", logging.ERROR))[0]


def log_failure(method: str, code: grpc.StatusCode, message: str) -> None:
    """Log a failed call with its kind, and record it on the current span."""
    kind, level = _KINDS.get(code, ("internal", logging.ERROR))
    log.log(level, "%s failed: %s %s", method, code.name, message, extra={"error_kind": kind})
    record_error(code.name, kind, message)


T = TypeVar("T")
Handler = Callable[..., Awaitable[T]]


def grpc_errors(method: Handler[T]) -> Handler[T]:
    """Wrap a unary aio servicer method: exceptions become the mapped gRPC status."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> T:
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as exc:  # every failure must reach the caller as a status
            code, message = status_of(exc)
            log_failure(method.__name__, code, message)
            trailers = exc.trailers() if isinstance(exc, StrataError) else ()
            await context.abort(code, message, trailing_metadata=trailers)
            raise AssertionError("unreachable") from exc

    return wrapper


def answers_unimplemented(
    base: type, server: str, hints: Mapping[str, str] | None = None
) -> Callable[[type[T]], type[T]]:
    """A class decorator: each method of the generated servicer `base` that the class does
    not define answers UNIMPLEMENTED naming the call, `server` and the hint (an alternative)
    of the first of `hints` its name starts with. The generated default raises
    NotImplementedError, which gRPC logs as an ERROR with a traceback for every call."""

    def unimplemented(name: str) -> Handler[Any]:
        hint = next((h for prefix, h in (hints or {}).items() if name.startswith(prefix)), None)
        message = f"{name} is not implemented by {server}" + (f"; {hint}" if hint else "")

        async def method(
            self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]
        ) -> Any:
            log_failure(name, Unimplemented.code, message)
            await context.abort(Unimplemented.code, message)

        method.__name__ = name
        return method

    def decorate(cls: type[T]) -> type[T]:
        for name, default in vars(base).items():
            if name[:1].isupper() and callable(default) and getattr(cls, name) is default:
                setattr(cls, name, unimplemented(name))
        return cls

    return decorate
