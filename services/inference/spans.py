"""The batcher's spans: each batch is a span of its own, linked to the spans of its requests.

A batch span starts a trace of its own, so no request's trace grows with other requests'
work; each request's span (the server span of its ModelInfer call) records how long it
queued and which batch it joined.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanContext, Status, StatusCode

_tracer = trace.get_tracer("strata.inference.batcher")


def current() -> SpanContext | None:
    """The caller's span, for a batch to link to."""
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


@contextlib.contextmanager
def member(traceparent: str, model: str) -> Iterator[None]:
    """For a member of a flight whose trace is sampled: a span of its own in that trace,
    linked to the flight's call, so its queue wait and its batch link land in its trace.
    Nothing for an unsampled member (it still reaches its batch's links via the call)."""
    if not traceparent.endswith("-01"):
        yield
        return
    call = trace.get_current_span().get_span_context()
    with _tracer.start_as_current_span(
        f"request {model}",
        context=propagate.extract({"traceparent": traceparent}),
        links=[Link(call)] if call.is_valid else [],
    ):
        yield


def start_batch(model: str, version: str, links: Sequence[SpanContext | None], rows: int) -> Span:
    return _tracer.start_span(
        "inference batch",
        context=Context(),
        links=[Link(link) for link in links if link is not None],
        attributes={
            "strata.model": model,
            "strata.model_version": version,
            "batch.requests": len(links),
            "batch.rows": rows,
        },
    )


def end_batch(span: Span, compute: float, failures: int) -> None:
    span.set_attribute("batch.compute_ms", compute * 1e3)
    if failures:
        span.set_attribute("batch.failed_requests", failures)
        span.set_status(Status(StatusCode.ERROR, f"{failures} requests failed"))
    span.end()


def note_request(queued: float, rows: int, batch: Span | None, enqueued_ns: int) -> None:
    """On the request's own span: its queue wait (also as a child span) and its batch."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("strata.queue_ms", queued * 1e3)
    wait = _tracer.start_span("queue wait", start_time=enqueued_ns)
    wait.end(end_time=enqueued_ns + int(queued * 1e9))
    if batch is not None:
        span.set_attribute("strata.batch_rows", rows)
        span.set_attribute("strata.batch_span_id", f"{batch.get_span_context().span_id:016x}")
