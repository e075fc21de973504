"""Server spans cost what their sampling is worth: the SDK's span only where it may be
recorded, else a non-recording span that still carries the caller's trace."""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from strata.telemetry import tracing

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"


def parent(flags: str) -> dict[str, str]:
    return {"traceparent": f"00-{TRACE_ID}-b7ad6b7169203331-{flags}"}


@pytest.fixture
def sampling(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    kept = InMemorySpanExporter()

    def install(endpoint: str | None, ratio: float = 1.0, trust_callers: bool = True) -> None:
        if endpoint:
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        else:
            monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
        # setup_tracing installs the global provider once per process; only the policy it
        # records is under test here.
        monkeypatch.setattr(trace, "set_tracer_provider", lambda provider: None)
        # Spans that record are kept in memory, not sent to the endpoint.
        monkeypatch.setattr(
            tracing, "BatchSpanProcessor", lambda _, **batching: SimpleSpanProcessor(kept)
        )
        provider = tracing.setup_tracing("test", None, ratio, trust_callers)
        monkeypatch.setattr(tracing, "_server_tracer", provider.get_tracer("test"))

    yield install
    monkeypatch.setattr(tracing, "_sampling", "sdk")
    monkeypatch.setattr(tracing, "_ratio", None)


def test_without_an_exporter_nothing_records_but_the_callers_trace_goes_on(sampling) -> None:
    sampling(None)
    with tracing.server_span("/svc/Method", parent("01")) as span:
        context = span.get_span_context()
        assert not span.is_recording()
        assert format(context.trace_id, "032x") == TRACE_ID
        assert trace.get_current_span() is span


@pytest.mark.parametrize("carrier", [{}, {"traceparent": "00-not-hex-at-all"}])
def test_without_an_exporter_a_call_with_no_trace_gets_ids_for_its_logs(sampling, carrier) -> None:
    sampling(None)
    with tracing.server_span("/svc/Method", carrier) as span:
        assert span.get_span_context().is_valid and not span.is_recording()


def test_with_an_exporter_an_unsampled_caller_stays_unsampled_cheaply(sampling) -> None:
    sampling("http://127.0.0.1:4317")
    with tracing.server_span("/svc/Method", parent("00")) as span:
        assert isinstance(span, trace.NonRecordingSpan)
        assert format(span.get_span_context().trace_id, "032x") == TRACE_ID
    assert tracing._sampling == "parent"


@pytest.mark.parametrize("flags", ["01", "00"])
def test_a_public_servers_callers_cannot_choose_sampling(sampling, flags: str) -> None:
    sampling("http://127.0.0.1:4317", ratio=0.0, trust_callers=False)
    with tracing.server_span("/svc/Method", parent(flags)) as span:
        assert not span.is_recording(), "ratio 0 samples nothing, whatever the client says"
        assert format(span.get_span_context().trace_id, "032x") == TRACE_ID
    sampling("http://127.0.0.1:4317", ratio=1.0, trust_callers=False)
    with tracing.server_span("/svc/Method", parent(flags)) as span:
        assert span.is_recording(), "the ratio decides, also against an unsampled flag"
        metadata = tracing.outgoing()
        assert dict(metadata)["traceparent"].endswith("-01"), "the decision propagates"


def test_a_trusted_callers_sampled_trace_is_kept_whatever_the_ratio(sampling) -> None:
    sampling("http://127.0.0.1:4317", ratio=0.0)
    with tracing.server_span("/svc/Method", parent("01")) as span:
        assert span.is_recording()
    assert tracing._sampling == "parent"


def test_a_changed_ratio_decides_from_the_next_trace_on(sampling) -> None:
    sampling("http://127.0.0.1:4317", ratio=1.0, trust_callers=False)
    assert tracing.set_sample_ratio(0.0)
    with tracing.server_span("/svc/Method", parent("01")) as span:
        assert not span.is_recording()
    assert tracing.set_sample_ratio(1.0)
    with tracing.server_span("/svc/Method", parent("00")) as span:
        assert span.is_recording()


def test_without_an_exporter_the_ratio_does_not_change(sampling) -> None:
    sampling(None)
    assert not tracing.exporting()
    assert not tracing.set_sample_ratio(1.0)


def test_a_public_server_samples_new_traces_at_its_ratio_on_the_ids_it_records(sampling) -> None:
    sampling("http://127.0.0.1:4317", ratio=0.5, trust_callers=False)
    limit, bound = (1 << 64) - 1, 1 << 63  # TraceIdRatioBased's: the low 64 bits, below 0.5
    sampled = 0
    for _ in range(2000):
        with tracing.server_span("/svc/Method", {}) as span:
            trace_id = span.get_span_context().trace_id
            assert span.get_span_context().is_valid
            assert span.is_recording() == (trace_id & limit < bound), "decided on its own id"
            sampled += span.is_recording()
    assert 850 < sampled < 1150, f"{sampled} of 2000 sampled at 0.5"


def test_a_public_server_decides_on_the_callers_trace_id(sampling) -> None:
    sampling("http://127.0.0.1:4317", ratio=0.5, trust_callers=False)
    # TRACE_ID's low 64 bits are above half their range; these are below.
    below = "0af7651916cd43dd0448eb211c80319c"
    for trace_id, recorded in ((TRACE_ID, False), (below, True)):
        carrier = {"traceparent": f"00-{trace_id}-b7ad6b7169203331-01"}
        with tracing.server_span("/svc/Method", carrier) as span:
            assert span.is_recording() is recorded
            assert format(span.get_span_context().trace_id, "032x") == trace_id


def test_an_unsampled_request_at_a_public_server_makes_no_sdk_span(sampling, monkeypatch) -> None:
    sampling("http://127.0.0.1:4317", ratio=0.0, trust_callers=False)

    def refuse(*args, **kwargs):
        raise AssertionError("the SDK was asked for a span the ratio drops")

    monkeypatch.setattr(tracing._server_tracer, "start_span", refuse)
    for carrier in ({}, parent("01")):
        with tracing.server_span("/svc/Method", carrier) as span:
            assert isinstance(span, trace.NonRecordingSpan) and span.get_span_context().is_valid
