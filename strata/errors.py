"""One error hierarchy and one mapping to gRPC status codes, for every hop.

Domain code raises these; servicers wrap their methods with strata.calls.grpc_errors, which turns
them into statuses. An unexpected exception becomes a generic INTERNAL that leaks no internals.
This module depends on nothing else in the package: every floor above may raise its errors.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import grpc

log = logging.getLogger(__name__)
RETRY_AFTER = "retry-after-ms"  # trailing metadata: how long to back off, in milliseconds
SHOWN_CHARACTERS = 128  # of one client string quoted in a message
MAX_MESSAGE_BYTES = 4096  # of an error message, in UTF-8: whatever went into it
MAX_LISTED = 20  # names of what exists that one refusal lists


def shown(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """A client's string (a name, key or id) as a message quotes it: repr'd, and past `limit`
    characters cut, with the original length stated: 'aaaa…' (1048576 characters)."""
    if len(text) <= limit:
        return repr(text)
    return f"{cut(text, limit)!r} ({len(text)} characters)"


def cut(text: str, limit: int = SHOWN_CHARACTERS) -> str:
    """A client's string echoed in a failure's fields (a model name, an id): at most `limit`
    characters, and an ellipsis where it was cut."""
    return text if len(text) <= limit else text[:limit] + "…"


def listed(names: Iterable[str], limit: int = MAX_LISTED) -> str:
    """What exists, as a refusal names it: sorted, quoted, each cut (`cut`), at most `limit`
    of them and how many more: `'a', 'b' and 12 more`; `none` for none."""
    ordered = sorted(names)
    if not ordered:
        return "none"
    more = len(ordered) - limit
    return ", ".join(repr(cut(name)) for name in ordered[:limit]) + (
        f" and {more} more" if more > 0 else ""
    )


def bounded(text: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """`text` in at most `limit` UTF-8 bytes: cut at a character, its original length stated."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    suffix = f"… ({len(text)} characters)"
    head = data[: max(0, limit - len(suffix.encode()))].decode("utf-8", "ignore")
    return head + suffix


class StrataError(Exception):
    """An error whose message is safe to show the caller."""

    code = grpc.StatusCode.INTERNAL

    def trailers(self) -> tuple[tuple[str, str], ...]:
        """Trailing metadata sent with the status (e.g. a retry hint)."""
        return ()


class InvalidArgument(StrataError):
    """The request is malformed; retrying it unchanged cannot succeed."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(StrataError):
    """No such pipeline, model or version."""

    code = grpc.StatusCode.NOT_FOUND


class NotReady(StrataError):
    """The server cannot do this as it stands: a model not loaded or not ready, a pipeline
    that does not make what it declares, a setting the deployment lacks. Never the
    caller's mistake: REST answers it 503, as Triton and KServe answer a model not ready."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class Miswired(NotReady):
    """A model refused tensors the server made for it (a pipeline's preprocess, an earlier
    model), not the client: the deployment's to mend, which no retry can; REST answers it
    500."""

    http_status = 500


class Overloaded(StrataError):
    """A rate limit or a full queue; the caller should back off for `retry_after` seconds."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after

    def trailers(self) -> tuple[tuple[str, str], ...]:
        if self.retry_after <= 0:
            return ()
        return ((RETRY_AFTER, str(max(1, round(self.retry_after * 1000)))),)


class Unavailable(StrataError):
    """This replica cannot answer now; another one may."""

    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(StrataError):
    """The caller's time budget ran out before the work could be done."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(StrataError):
    """No valid credentials (API key or admin token)."""

    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(StrataError):
    """The caller may not do this: a capability its key lacks, or a call this server has off."""

    code = grpc.StatusCode.PERMISSION_DENIED


class AlreadyExists(StrataError):
    """The name is taken (a shared memory region)."""

    code = grpc.StatusCode.ALREADY_EXISTS


class Unimplemented(StrataError):
    """A call of the protocol this server does not offer."""

    code = grpc.StatusCode.UNIMPLEMENTED


class Upstream(StrataError):
    """A status returned by the next hop, passed on unchanged to our caller."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class MalformedReply(Upstream):
    """A layer or model server answered what the protocol does not allow: a fault on the
    serving side, never the caller's (INTERNAL, naming who answered)."""

    def __init__(self, source: str, problem: str) -> None:
        message = f"{source} answered a malformed reply: {problem}"
        super().__init__(grpc.StatusCode.INTERNAL, message)


_BY_CODE = {cls.code: cls for cls in StrataError.__subclasses__() if cls is not Upstream}


def from_code(code: int | grpc.StatusCode, message: str, retry_after: float = 0.0) -> StrataError:
    """The domain error for a status code (as carried in a strata.v1 Error), with the
    caller's retry hint where it is an overload."""
    status = code if isinstance(code, grpc.StatusCode) else _status_of(code)
    if status == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Overloaded(message, retry_after)
    known = _BY_CODE.get(status)
    return known(message) if known else Upstream(status, message)


def retry_after_of(exc: BaseException) -> float:
    """The seconds an error asks its caller to wait before retrying (0: no hint)."""
    return exc.retry_after if isinstance(exc, Overloaded) else 0.0


def hinted_retry(metadata: Iterable[tuple[str, str | bytes]] | None) -> float:
    """The `retry-after-ms` hint in a call's trailing metadata, in seconds (0: none)."""
    for key, value in metadata or ():
        if key == RETRY_AFTER:
            try:
                return max(0.0, float(value) / 1000)
            except ValueError:
                return 0.0
    return 0.0


def _status_of(value: int) -> grpc.StatusCode:
    for status in grpc.StatusCode:
        if status.value[0] == value:
            return status
    return grpc.StatusCode.UNKNOWN


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    """The status code and caller-safe message for any exception, in at most
    MAX_MESSAGE_BYTES (a client's strings in it are cut to SHOWN_CHARACTERS where it was
    made; this bounds whatever was missed, and a next hop's message passed on)."""
    if isinstance(exc, StrataError):
        return exc.code, bounded(str(exc))
    if isinstance(exc, grpc.aio.AioRpcError):
        return exc.code(), bounded(exc.details() or exc.code().name)
    log.error("unexpected error", exc_info=exc, extra={"error_kind": "internal"})
    return grpc.StatusCode.INTERNAL, "internal error; the server log has the details"
