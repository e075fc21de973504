"""strata.telemetry.propagation reads and writes trace context as opentelemetry.propagate does."""

import contextvars

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.trace.span import TraceState

from strata.telemetry import propagation

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
hex_digits = st.text(alphabet="0123456789abcdefABCDEF-", max_size=40)


def _seen(context) -> tuple:
    """What a context tells the span that follows it: its parent and the baggage."""
    span = trace.get_current_span(context).get_span_context()
    return span, span.trace_state, dict(baggage.get_all(context))


@pytest.mark.parametrize(
    "carrier",
    [
        {"traceparent": f"00-{TRACE}-{SPAN}-01"},
        {"traceparent": f"00-{TRACE}-{SPAN}-00"},
        {"traceparent": f"00-{TRACE}-{SPAN}-03"},
        {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},
        {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},
        {"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"},
        {"traceparent": f"01-{TRACE}-{SPAN}-01-extra"},
        {"traceparent": f"00-{TRACE}-{SPAN}-01-extra"},
        {"traceparent": f"ff-{TRACE}-{SPAN}-01"},
        {"traceparent": f" 00-{TRACE}-{SPAN}-01 "},
        {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=1,other=two"},
        {"traceparent": f"00-{TRACE}-{SPAN}-01", "baggage": "user=alice"},
        {"traceparent": ""},
        {},
    ],
)
def test_extract_reads_what_the_propagators_read(carrier) -> None:
    assert _seen(propagation.extract(carrier)) == _seen(propagate.extract(carrier))


@given(st.builds("{}-{}-{}-{}".format, hex_digits, hex_digits, hex_digits, hex_digits))
def test_any_traceparent_is_read_as_the_propagators_read_it(traceparent: str) -> None:
    carrier = {"traceparent": traceparent}
    assert _seen(propagation.extract(carrier)) == _seen(propagate.extract(carrier))


def _within(span_context: SpanContext, context=None) -> otel_context.Context:
    return trace.set_span_in_context(NonRecordingSpan(span_context), context)


@pytest.mark.parametrize(
    "span_context",
    [
        SpanContext(int(TRACE, 16), int(SPAN, 16), False, TraceFlags(1)),
        SpanContext(int(TRACE, 16), int(SPAN, 16), False, TraceFlags(0)),
        SpanContext(int(TRACE, 16), 1, False, TraceFlags(3), TraceState([("vendor", "1")])),
        trace.INVALID_SPAN_CONTEXT,
    ],
)
def test_inject_writes_what_the_propagators_write(span_context) -> None:
    ours, theirs = {}, {}
    propagation.inject(ours, _within(span_context))
    propagate.inject(theirs, context=_within(span_context))
    assert ours == theirs


def test_inject_carries_baggage_as_the_propagators_do() -> None:
    context = _within(
        SpanContext(int(TRACE, 16), int(SPAN, 16), False, TraceFlags(1)),
        baggage.set_baggage("user", "alice"),
    )
    ours, theirs = {}, {}
    propagation.inject(ours, context)
    propagate.inject(theirs, context=context)
    assert ours == theirs
    assert ours["baggage"] == "user=alice"


def test_inject_writes_the_current_context_by_default() -> None:
    span_context = SpanContext(int(TRACE, 16), int(SPAN, 16), False, TraceFlags(1))
    token = otel_context.attach(_within(span_context))
    try:
        carrier = {}
        propagation.inject(carrier)
    finally:
        otel_context.detach(token)
    assert carrier == {"traceparent": f"00-{TRACE}-{SPAN}-01"}


def test_propagators_set_by_the_application_are_used() -> None:
    only_traceparent = CompositePropagator([TraceContextTextMapPropagator()])
    before = propagate.get_global_textmap()
    propagate.set_global_textmap(only_traceparent)
    try:
        carrier = {"traceparent": f"00-{TRACE}-{SPAN}-01", "baggage": "user=alice"}
        # The application's propagators ignore baggage: so does Strata.
        assert baggage.get_all(propagation.extract(carrier)) == {}
    finally:
        propagate.set_global_textmap(before)


@pytest.fixture
def tracer():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


def test_current_makes_the_span_current_then_ends_it(tracer) -> None:
    tracer, exporter = tracer
    span = tracer.start_span("work")
    with propagation.Current(span) as current:
        assert current is span
        assert trace.get_current_span() is span
    assert trace.get_current_span() is not span
    (finished,) = exporter.get_finished_spans()
    assert finished.name == "work"
    assert finished.status.status_code == StatusCode.UNSET


@pytest.mark.parametrize("record_exception", [True, False])
def test_current_marks_the_span_failed_by_an_exception(tracer, record_exception: bool) -> None:
    tracer, exporter = tracer
    span = tracer.start_span("work")
    with pytest.raises(ValueError), propagation.Current(span, record_exception):
        raise ValueError("bad rows")
    (finished,) = exporter.get_finished_spans()
    assert finished.status.status_code == StatusCode.ERROR
    assert finished.status.description == "ValueError: bad rows"
    assert [e.name for e in finished.events] == (["exception"] if record_exception else [])
    assert trace.get_current_span() is trace.INVALID_SPAN


def test_current_records_what_the_sdks_own_does(tracer) -> None:
    tracer, exporter = tracer
    with pytest.raises(ValueError), tracer.start_as_current_span("sdk"):
        raise ValueError("bad rows")
    with pytest.raises(ValueError), propagation.Current(tracer.start_span("ours")):
        raise ValueError("bad rows")
    sdk, ours = exporter.get_finished_spans()
    assert ours.status.description == sdk.status.description
    assert [(e.name, e.attributes["exception.type"]) for e in ours.events] == [
        (e.name, e.attributes["exception.type"]) for e in sdk.events
    ]


class _Call:
    """A servicer context's metadata, counting how often it is read."""

    def __init__(self, metadata: tuple) -> None:
        self.metadata, self.reads = metadata, 0

    def invocation_metadata(self) -> tuple:
        self.reads += 1
        return self.metadata


def test_call_metadata_is_made_once_a_call_and_never_lent_to_another() -> None:
    first = _Call((("x-client-id", "a"), ("key-bin", b"\x00")))
    second = _Call((("x-client-id", "b"),))

    def serve() -> list[dict[str, str]]:
        return [propagation.call_metadata(c) for c in (first, first, second, first)]

    seen = contextvars.copy_context().run(serve)
    assert [m["x-client-id"] for m in seen] == ["a", "a", "b", "a"]
    assert seen[0] == {"x-client-id": "a"}  # binary entries left out
    assert (first.reads, second.reads) == (2, 1)  # the second call's read replaced the first's
