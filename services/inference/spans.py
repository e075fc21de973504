"""The batcher's spans: a batch of several calls' requests is a span of its own, linked to the
spans of its requests; a batch of one call's requests is recorded on that call's span.

A batch span starts a trace of its own, so no request's trace grows with other requests'
work; each request's span (the server span of its ModelInfer call) records how long it
queued and which batch it joined. A flight's members have no span here: the batch links to
each sampled member's own span (named by its traceparent), with its queue time on the link.
A batch whose requests all came from one call (a lone request, or one flight: nearly every
batch at light load) would add a span that tells nothing its call's span cannot: the call's
span takes its attributes and links instead, which spares a span's cost per call.
"""

from __future__ import annotations

from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import INVALID_SPAN, Link, Span, SpanContext, Status, StatusCode

from strata.telemetry import propagation
from strata.telemetry.tracing import exporting

_tracer = trace.get_tracer("services.inference.batcher")


def sampled(traceparent: str) -> SpanContext | None:
    """The span a sampled W3C traceparent names (a flight member's), for its batch to link
    to with its queue time; None for an unsampled one, which nothing records."""
    if traceparent[53:55] != "01":
        return None
    context = trace.get_current_span(propagation.extract({"traceparent": traceparent}))
    return context.get_span_context()


def current() -> SpanContext | None:
    """The caller's span, for a batch to link to."""
    context = trace.get_current_span().get_span_context()
    return context if context.is_valid else None


def caller() -> Span | None:
    """The recording span of the call queueing a request (its server span), if any."""
    span = trace.get_current_span()
    return span if span.is_recording() else None


def start_batch(
    model: str,
    version: str,
    links: Sequence[tuple[SpanContext | None, float]],
    rows: int,
    caller: Span | None = None,
) -> Span:
    """The span that records a batch: `caller`, the span of the one call all its requests
    came from, where there is one; else a span of its own. Either gets the batch's model and
    size and is linked to each request's span (but the caller's own) with the seconds it
    queued. A call whose requests took several batches keeps the last one's figures. Where
    no span is exported (no OTLP endpoint), a non-recording span stands for it: the SDK's
    would draw ids and ask the sampler for every batch, for a span no one keeps."""
    if caller is None and not exporting():
        return INVALID_SPAN
    attributes: dict[str, str | int] = {
        "strata.model": model,
        "strata.model_version": version,
        "batch.requests": len(links),
        "batch.rows": rows,
    }
    if caller is not None:
        caller.set_attributes(attributes)
        own = caller.get_span_context()
        for link, queued in links:
            if link is not None and link != own:
                caller.add_link(link, {"strata.queue_ms": queued * 1e3})
        return caller
    return _tracer.start_span(
        "inference batch",
        context=Context(),
        links=[
            Link(link, {"strata.queue_ms": queued * 1e3})
            for link, queued in links
            if link is not None
        ],
        attributes=attributes,
    )


def end_batch(span: Span, compute: float, failures: int, own: bool = True) -> None:
    """The batch's compute time and failures on its span, which ends if it is the batch's
    `own`; a call's span records the batch's failures, but its own status is its call's."""
    if not span.is_recording():  # a call's span, ended as its call was cancelled
        return
    span.set_attribute("batch.compute_ms", compute * 1e3)
    if failures:
        span.set_attribute("batch.failed_requests", failures)
    if own:
        if failures:
            span.set_status(Status(StatusCode.ERROR, f"{failures} requests failed"))
        span.end()


def note_request(queued: float, rows: int, batch: Span | None) -> None:
    """On the request's own span: its queue wait and its batch (attributes: a span of its
    own for the wait would cost more than it tells)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("strata.queue_ms", queued * 1e3)
    if batch is not None and batch is not span:
        span.set_attribute("strata.batch_rows", rows)
        span.set_attribute("strata.batch_span_id", f"{batch.get_span_context().span_id:016x}")
