"""Spans exported from a child process: what reaches the collector is what the SDK made."""

from __future__ import annotations

import os
import threading
import time

import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from strata.telemetry.spanexport import (
    CHILD_NICENESS,
    EXPORT_SECONDS,
    HEADER,
    Batch,
    ChildSpanExporter,
    FrameReader,
    encode,
    translate,
)
from strata.telemetry.traces import Receiver

RESOURCE = Resource.create({"service.name": "svc"})


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans = []

    def export(self, spans):
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def finished_spans() -> list:
    kept = Kept()
    provider = TracerProvider(resource=RESOURCE)
    provider.add_span_processor(SimpleSpanProcessor(kept))
    tracer = provider.get_tracer("strata.test", "1.0")
    caller = SpanContext(
        0x0AF7651916CD43DD8448EB211C80319C,
        0xB7AD6B7169203331,
        is_remote=True,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "v1")]),
    )
    parent = trace.set_span_in_context(NonRecordingSpan(caller))
    with tracer.start_as_current_span("root", parent, kind=SpanKind.SERVER) as root:
        root.set_attribute("strata.steps", ("resize", "scale"))
        root.set_attribute("strata.hop.preprocess_ms", 0.42)
        root.add_event("error", {"error.code": "INVALID_ARGUMENT", "error.retryable": False})
        root.set_status(Status(StatusCode.ERROR, "INVALID_ARGUMENT: bad shape"))
        with tracer.start_as_current_span("child", links=[Link(root.get_span_context(), {"n": 3})]):
            pass
    return kept.spans


def test_frames_translate_to_the_request_the_sdk_would_send() -> None:
    spans = finished_spans()
    frame = encode(spans)
    (size,) = HEADER.unpack_from(frame)
    assert size == len(frame) - HEADER.size
    # The OTLP message the child sends is the one the serving process would have sent, spans
    # split over two frames included.
    body = frame[HEADER.size :]
    assert translate([body], RESOURCE) == encode_spans(spans)
    halves = [encode(spans[:1])[HEADER.size :], encode(spans[1:])[HEADER.size :]]
    assert translate(halves, RESOURCE) == encode_spans(spans)


def test_frames_written_together_are_read_together_and_a_partial_one_waits() -> None:
    spans = finished_spans()
    read, write = os.pipe()
    try:
        frame = encode(spans)
        os.write(write, frame + frame + frame[:5])
        reader = FrameReader(read)
        assert reader.frames() == [frame[HEADER.size :]] * 2
        os.write(write, frame[5:])
        os.close(write)
        assert reader.frames() == [frame[HEADER.size :]]
        assert reader.frames() is None
    finally:
        os.close(read)


@pytest.mark.timing
def test_frames_within_the_export_interval_go_in_one_export() -> None:
    spans = finished_spans()
    frame = encode(spans)
    read, write = os.pipe()
    try:
        batch = Batch(FrameReader(read))
        os.write(write, frame)
        later = threading.Timer(EXPORT_SECONDS / 4, os.write, (write, frame))
        later.start()
        started = time.monotonic()
        assert batch.next() == [frame[HEADER.size :]] * 2
        assert time.monotonic() - started >= EXPORT_SECONDS * 0.9
        later.join()
        # The pipe's end ends the gathering at once, with what arrived.
        os.write(write, frame)
        os.close(write)
        started = time.monotonic()
        assert batch.next() == [frame[HEADER.size :]]
        assert time.monotonic() - started < EXPORT_SECONDS
        assert batch.next() is None
    finally:
        os.close(read)


@pytest.mark.slow  # starts the exporter's process
def test_the_child_process_exports_to_an_otlp_receiver() -> None:
    with Receiver() as receiver:
        exporter = ChildSpanExporter(RESOURCE, f"http://127.0.0.1:{receiver.port}")
        spans = finished_spans()
        assert exporter.export(spans) is SpanExportResult.SUCCESS
        trace_id = format(spans[0].context.trace_id, "032x")
        received = receiver.wait_for(trace_id, {"svc"})
        # Its work yields to the serving processes' where they compete for a core.
        child = exporter._child.pid
        ours = os.getpriority(os.PRIO_PROCESS, 0)
        assert os.getpriority(os.PRIO_PROCESS, child) == min(19, ours + CHILD_NICENESS)
        exporter.shutdown()  # the child exports what it has read, then ends
    assert sorted(s.name for s in received) == ["child", "root"]
    assert exporter.export(spans) is SpanExportResult.FAILURE  # no child any more
