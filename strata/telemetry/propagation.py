"""Trace context in and out of a call's metadata, and a span made current: what
`opentelemetry.propagate` and the SDK's `start_as_current_span` do, with less machinery.

The default propagators (W3C trace context and baggage, a composite of two, each with its
getter, setter and regular expression) cost 10-15 us a call each way here, on every hop of
every sampled request. Where the propagation is the default one and the call carries plain
W3C trace context (a version-00 `traceparent`, no `tracestate`, no baggage), the header is
read and written here, with the same result; anything else goes to `opentelemetry.propagate`,
so that configured propagators (OTEL_PROPAGATORS, `set_global_textmap`) keep working.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from contextvars import ContextVar
from typing import Any

import grpc
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext, Status, StatusCode, TraceFlags

_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_DEFAULT_PROPAGATORS = ("tracecontext,baggage", "tracecontext")
_W3C = os.environ.get("OTEL_PROPAGATORS", "tracecontext,baggage").replace(" ", "")
_CONFIGURED = propagate.get_global_textmap()  # as the environment set it up


def text_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> dict[str, str]:
    """A call's metadata by name, its binary (`-bin`) entries left out: every header read
    from it (trace context, tokens, client ids) is text."""
    return {key: value for key, value in metadata or () if isinstance(value, str)}


_CALL: ContextVar[tuple[object, dict[str, str]]] = ContextVar("strata_call_metadata")


def call_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> dict[str, str]:
    """The text metadata of the call `context` serves, made once a call: the server span's
    wrapper (telemetry.py) and the gateway's door both read it, in the call's task. The
    context is held with it, so a task that serves another call never reads the wrong one."""
    held = _CALL.get(None)
    if held is not None and held[0] is context:
        return held[1]
    metadata = text_metadata(context.invocation_metadata())
    _CALL.set((context, metadata))
    return metadata


def _plain_w3c() -> bool:
    """Whether trace context travels as the default propagators carry it."""
    return _W3C in _DEFAULT_PROPAGATORS and propagate.get_global_textmap() is _CONFIGURED


def extract(carrier: Mapping[str, str]) -> Context:
    """The caller's context from `carrier`, as `propagate.extract` makes it."""
    if _plain_w3c() and "tracestate" not in carrier and "baggage" not in carrier:
        match = _TRACEPARENT.fullmatch(carrier.get("traceparent", ""))
        if match is not None:
            trace_id, span_id = int(match[1], 16), int(match[2], 16)
            if trace_id and span_id:
                flags = TraceFlags(int(match[3], 16))
                context = SpanContext(trace_id, span_id, is_remote=True, trace_flags=flags)
                return trace.set_span_in_context(NonRecordingSpan(context), Context())
    return propagate.extract(carrier)


def inject(carrier: MutableMapping[str, str], context: Context | None = None) -> None:
    """The trace context of `context` (the current one by default) into `carrier`, as
    `propagate.inject` puts it there."""
    if not _plain_w3c() or baggage.get_all(context):
        propagate.inject(carrier, context=context)
        return
    span = trace.get_current_span(context).get_span_context()
    if not span.is_valid:
        return
    carrier["traceparent"] = f"00-{span.trace_id:032x}-{span.span_id:016x}-{span.trace_flags:02x}"
    if span.trace_state:
        carrier["tracestate"] = span.trace_state.to_header()


class Current:
    """`span` made the current span for a `with` block and ended after it; if the block
    raises, the exception recorded on it (unless `record_exception` is False) and its status
    set to an error: the SDK's `start_as_current_span`, in one layer instead of three
    generator-based context managers (about 8 us a span here)."""

    __slots__ = ("_record", "_span", "_token")

    def __init__(self, span: trace.Span, record_exception: bool = True) -> None:
        self._span = span
        self._record = record_exception

    def __enter__(self) -> trace.Span:
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self._span

    def __exit__(self, kind: type | None, error: BaseException | None, _: object) -> None:
        otel_context.detach(self._token)
        # As the SDK does: an Exception (not, say, a cancellation) marks the span.
        if isinstance(error, Exception) and self._span.is_recording():
            if self._record:
                self._span.record_exception(error)
            self._span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self._span.end()
