"""A flight as one v2 ModelInfer: the stacked rows of several client requests.

This module writes and reads every parameter below (the gateway writes, inference reads).
The gateway sends a flight to inference as an ordinary v2 batch, with each member's rows,
trace context and deadline in string parameters, so that any v2 server can stand behind a
route: it just sees a batch, by the call's gRPC deadline (the latest of its members'). Strata's
inference service queues each member as a request of its own: its own deadline, its own
error, its own link from the batch's span.

- `strata.rows`: the members' row counts, in order ("1,1,3").
- `strata.trace_contexts`: each member's W3C traceparent ("" for none), comma-separated.
- `strata.timeouts_us`: each member's deadline (strata.wire.deadline) as the microseconds it has
  left when the flight is sent; 0 for none of its own.
- `strata.trace_context`: on a stream, the traceparent of the call itself (a unary call
  carries it in its metadata); any request may have it, a flight or not.
- `strata.errors` (in the response): JSON `{"<member index>": [code, message, retry_ms]}`
  for members that failed (retry_ms: the back-off an overload asks for, 0 for none); the
  outputs are stacked over the others, in order.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.internal.containers import MessageMap

from strata.errors import (
    InvalidArgument,
    StrataError,
    from_code,
    retry_after_of,
    shown,
    status_of,
)
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.deadline import Deadline

ROWS = "strata.rows"
TRACE_CONTEXTS = "strata.trace_contexts"
TIMEOUTS = "strata.timeouts_us"
TRACE_CONTEXT = "strata.trace_context"
ERRORS = "strata.errors"

Parameters = Mapping[str, v2.InferParameter]
Writable = MessageMap[str, v2.InferParameter]  # a message's parameters, written in place


@dataclass(frozen=True)
class FlightMember:
    rows: int
    traceparent: str
    deadline: Deadline | None  # None: none of its own (the call's applies)


def is_flight(parameters: Parameters) -> bool:
    return ROWS in parameters


def set_members(parameters: Writable, members: Sequence[FlightMember]) -> None:
    """Write a flight's members into a request's parameters (what `members` reads)."""
    parameters[ROWS].string_param = ",".join(str(m.rows) for m in members)
    parameters[TRACE_CONTEXTS].string_param = ",".join(m.traceparent for m in members)
    parameters[TIMEOUTS].string_param = ",".join(_us(m.deadline) for m in members)


def members(parameters: Parameters, total_rows: int) -> list[FlightMember]:
    """The members a flight request declares, checked against the rows it carries."""
    rows = _integers(parameters, ROWS)
    if any(r <= 0 for r in rows) or sum(rows) != total_rows:
        raise InvalidArgument(
            f"parameter {ROWS!r} must be positive row counts adding up to the batch's "
            f"{total_rows} rows, got {shown(_text(parameters, ROWS))}"
        )
    contexts = _text(parameters, TRACE_CONTEXTS).split(",") if TRACE_CONTEXTS in parameters else []
    timeouts = _integers(parameters, TIMEOUTS) if TIMEOUTS in parameters else []
    for name, values in ((TRACE_CONTEXTS, contexts), (TIMEOUTS, timeouts)):
        if values and len(values) != len(rows):
            raise InvalidArgument(
                f"parameter {name!r} has {len(values)} entries for {len(rows)} members"
            )
    return [
        FlightMember(
            r, contexts[i] if contexts else "", Deadline.from_us(timeouts[i]) if timeouts else None
        )
        for i, r in enumerate(rows)
    ]


def _us(deadline: Deadline | None) -> str:
    return str(deadline.to_us()) if deadline is not None else "0"


def set_errors(parameters: Writable, errors: Mapping[int, BaseException]) -> None:
    """Write members' errors into a response's parameters."""
    if errors:
        payload = {str(index): _entry(exc) for index, exc in errors.items()}
        parameters[ERRORS].string_param = json.dumps(payload)


def _entry(exc: BaseException) -> list[int | str]:
    code, message = status_of(exc)
    return [code.value[0], message, round(retry_after_of(exc) * 1000)]


def member_errors(parameters: Parameters, count: int) -> dict[int, StrataError]:
    """The members' errors a response reports (none from a server that knows no flights)."""
    if ERRORS not in parameters:
        return {}
    try:
        payload = json.loads(parameters[ERRORS].string_param)
        errors = {int(key): _error(*entry) for key, entry in payload.items()}
    except (ValueError, TypeError) as exc:
        raise RuntimeError(f"unreadable {ERRORS!r} in an inference response: {exc}") from None
    if any(not 0 <= index < count for index in errors):
        raise RuntimeError(f"{ERRORS!r} names a member outside 0..{count - 1}")
    return errors


def _error(code: int, message: str, retry_ms: float = 0) -> StrataError:
    return from_code(int(code), str(message), float(retry_ms) / 1000)


def set_call_traceparent(parameters: Writable, traceparent: str) -> None:
    """Write the traceparent of the call a request on a stream stands for."""
    parameters[TRACE_CONTEXT].string_param = traceparent


def call_traceparent(parameters: Parameters) -> str:
    """The traceparent a request sent on a stream carries for its call ("" for none): what a
    unary call would carry in its metadata."""
    return _text(parameters, TRACE_CONTEXT) if TRACE_CONTEXT in parameters else ""


def _text(parameters: Parameters, name: str) -> str:
    param = parameters[name]
    if param.WhichOneof("parameter_choice") != "string_param":
        raise InvalidArgument(f"parameter {name!r} must be a string")
    return param.string_param


def _integers(parameters: Parameters, name: str) -> list[int]:
    try:
        return [int(part) for part in _text(parameters, name).split(",")]
    except ValueError:
        raise InvalidArgument(
            f"parameter {name!r} must be comma-separated integers, got "
            f"{shown(_text(parameters, name))}"
        ) from None
