"""The OTLP receiver behind `make trace`: it receives real OTLP exports and prints trees."""

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from strata.telemetry.traces import Receiver, render


def test_receiver_collects_exported_spans_and_renders_the_tree() -> None:
    with Receiver() as receiver:
        exporter = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{receiver.port}", insecure=True)
        provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("root") as root:
            root.set_attribute("strata.pipeline", "digits")
            with tracer.start_as_current_span("child"):
                pass
        provider.shutdown()
        trace_id = format(root.get_span_context().trace_id, "032x")
        spans = receiver.wait_for(trace_id, {"svc"})
    assert {s.name for s in spans} == {"root", "child"}
    lines = render(spans).splitlines()
    assert lines[0] == f"trace {trace_id}"
    assert lines[1].startswith("  svc: root ") and "strata.pipeline=digits" in lines[1]
    assert lines[2].startswith("    svc: child ")


def test_a_second_receiver_on_a_port_in_use_fails_instead_of_sharing_it() -> None:
    with Receiver() as first, pytest.raises(RuntimeError, match="Failed to bind"):
        Receiver(f"127.0.0.1:{first.port}")
