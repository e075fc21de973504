"""Spans exported off the serving path: a child process does the OTLP work.

Encoding a span for OTLP is pure Python in the SDK's exporter (about as costly as making the
span), and it runs under the serving process's GIL, where every microsecond is taken from
requests. Here the serving process only copies each finished span into a compact record and
writes a batch of them, as one JSON frame, to a child process's stdin; the child
(`python -m strata.telemetry.spanexport`) builds from the records the OTLP request the SDK's encoder
would make of those spans and sends it with the SDK's own OTLP exporter, configured by the
standard OTEL_EXPORTER_OTLP_* variables it inherits. The SDK's BatchSpanProcessor stays in
front: it batches, and drops spans once its queue is full, so a slow or dead child never holds
a request up. The child ends when its stdin closes, on the serving process's shutdown or
death.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, cast

import orjson
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext

log = logging.getLogger(__name__)
HEADER = struct.Struct(">I")  # a frame's length, then the frame
CHILD_EXIT_SECONDS = 5.0
READ_BYTES = 1 << 20  # at most, per read of the pipe
# The child sends what has arrived at most this often: an OTLP call costs about a millisecond
# of CPU whatever it carries, and the serving process hands over small batches often.
EXPORT_SECONDS = 0.5
# The child's work is background work: where it competes with the serving processes for the
# machine's cores, the scheduler gives them the CPU first (a burst of export work landing on
# a request in flight was a source of tail latency).
CHILD_NICENESS = 10


def _context(context: SpanContext) -> list[Any]:
    # 128-bit ids travel as hex: JSON numbers stop at 64 bits.
    return [
        format(context.trace_id, "032x"),
        format(context.span_id, "016x"),
        context.is_remote,
        int(context.trace_flags),
        context.trace_state.to_header() if context.trace_state else "",
    ]


def _record(span: ReadableSpan) -> list[Any]:
    """A finished span as plain JSON values."""
    scope = span.instrumentation_scope
    status = span.status
    return [
        span.name,
        _context(span.context),
        _context(span.parent) if span.parent is not None else None,
        span.kind.value,
        span.start_time,
        span.end_time,
        status.status_code.value,
        status.description,
        _plain(span.attributes),
        [[e.name, e.timestamp, _plain(e.attributes)] for e in span.events],
        [[_context(k.context), _plain(k.attributes)] for k in span.links],
        [scope.name, scope.version] if scope is not None else None,
    ]


def _plain(attributes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Attributes as a dict: the SDK's own mappings copy their dict at once (a quarter of a
    microsecond for a dozen), where dict() asks them key by key (three)."""
    if not attributes:
        return {}
    copy = getattr(attributes, "copy", None)
    return copy() if copy is not None else dict(attributes)


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """One frame: the spans' records."""
    body = orjson.dumps([_record(span) for span in spans])
    return HEADER.pack(len(body)) + body


class ChildSpanExporter(SpanExporter):
    """A SpanExporter that hands spans to a child exporter process (module docstring)."""

    def __init__(self, resource: Resource, endpoint: str) -> None:
        attributes = orjson.dumps(dict(resource.attributes)).decode()
        command = (
            "-m",
            "strata.telemetry.spanexport",
            "--resource",
            attributes,
            "--endpoint",
            endpoint,
        )
        self._child = subprocess.Popen([sys.executable, *command], stdin=subprocess.PIPE)
        self._pipe = cast(IO[bytes], self._child.stdin)  # a pipe: stdin=PIPE above
        self._lock = threading.Lock()  # export and shutdown may come from two threads
        self._failed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        frame = encode(spans)
        with self._lock:
            try:
                self._pipe.write(frame)
                self._pipe.flush()
            except (OSError, ValueError):  # the child is gone, or shut down
                if not self._failed:
                    log.warning("the span exporter process has exited: spans are dropped")
                self._failed = True
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._pipe.close()
        try:
            self._child.wait(CHILD_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# The child's side: the OTLP request is built from the records directly, in place. The SDK's
# encoder (a message made for every value, then copied into its parent) took 49-57 us a span
# here, after about 10 to rebuild SDK spans from the records; filling one request in place,
# 11-13, measured side by side.
# The SDK's exporter still sends it (endpoint, TLS, headers, retries from OTEL_EXPORTER_OTLP_*).

SPAN_FLAGS_HAS_IS_REMOTE = trace_pb2.SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
SPAN_FLAGS_IS_REMOTE = trace_pb2.SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


def _set_value(target: AnyValue, value: Any) -> None:
    """An attribute's value into OTLP's AnyValue, as the SDK's encoder makes it (JSON gave
    arrays back as lists)."""
    kind = type(value)
    if kind is str:
        target.string_value = value
    elif kind is bool:
        target.bool_value = value
    elif kind is int:
        target.int_value = value
    elif kind is float:
        target.double_value = value
    elif kind is list:
        array = target.array_value
        array.SetInParent()
        for item in value:
            _set_value(array.values.add(), item)
    elif value is None:
        target.SetInParent()
    else:
        raise TypeError(f"an attribute of type {kind.__name__} has no OTLP encoding")


def _set_attributes(target: Any, attributes: dict[str, Any]) -> None:
    for key, value in attributes.items():
        pair = target.add()
        pair.key = key
        _set_value(pair.value, value)


def _flags(context: list[Any] | None) -> int:
    if context is not None and context[2]:  # the context is remote
        return SPAN_FLAGS_HAS_IS_REMOTE | SPAN_FLAGS_IS_REMOTE
    return SPAN_FLAGS_HAS_IS_REMOTE


def _fill_span(span: trace_pb2.Span, record: list[Any]) -> None:
    name, context, parent, kind, start, end, code, text, attributes, events, links, _ = record
    span.trace_id = bytes.fromhex(context[0])
    span.span_id = bytes.fromhex(context[1])
    span.trace_state = context[4]
    if parent is not None:
        span.parent_span_id = bytes.fromhex(parent[1])
    span.name = name
    span.kind = kind + 1  # OTLP's kinds start at 1 (0 is unspecified); the SDK's at 0
    span.start_time_unix_nano = start
    span.end_time_unix_nano = end
    _set_attributes(span.attributes, attributes)
    for event_name, timestamp, event_attributes in events:
        event = span.events.add()
        event.name = event_name
        event.time_unix_nano = timestamp
        _set_attributes(event.attributes, event_attributes)
    for link_context, link_attributes in links:
        link = span.links.add()
        link.trace_id = bytes.fromhex(link_context[0])
        link.span_id = bytes.fromhex(link_context[1])
        _set_attributes(link.attributes, link_attributes)
        link.flags = _flags(link_context)
    span.status.SetInParent()
    span.status.code = code
    if text is not None:
        span.status.message = text
    span.flags = _flags(parent)


def translate(bodies: Sequence[bytes], resource: Resource) -> ExportTraceServiceRequest:
    """One OTLP export request for every span in the frames' `bodies`: the message the SDK's
    own encoder would make of the spans the serving process finished."""
    request = ExportTraceServiceRequest()
    spans_of = request.resource_spans.add()
    spans_of.resource.SetInParent()
    _set_attributes(spans_of.resource.attributes, dict(resource.attributes))
    spans_of.schema_url = resource.schema_url
    by_scope: dict[tuple[str, str | None] | None, Any] = {}
    for body in bodies:
        for record in orjson.loads(body):
            scope = tuple(record[-1]) if record[-1] else None
            if scope not in by_scope:
                by_scope[scope] = _scope_spans(spans_of, scope)
            _fill_span(by_scope[scope].add(), record)
    return request


def _scope_spans(spans_of: trace_pb2.ResourceSpans, scope: tuple[str, str | None] | None) -> Any:
    """A new ScopeSpans for `scope` in `spans_of`: its repeated spans field."""
    scoped = spans_of.scope_spans.add()
    scoped.scope.SetInParent()
    if scope is not None:
        scoped.scope.name = scope[0]
        if scope[1] is not None:
            scoped.scope.version = scope[1]
    return scoped.spans


class FrameReader:
    """Frames from a pipe: each read takes whatever has arrived, so frames written while the
    last export ran are exported together."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def frames(self, timeout: float | None = None) -> list[bytes] | None:
        """Every whole frame that has arrived (waiting for one, or `timeout` seconds for
        none: []); None once the pipe ends."""
        while not (frames := self._whole_frames()):
            if timeout is not None and not select.select([self._fd], [], [], timeout)[0]:
                return []
            chunk = os.read(self._fd, READ_BYTES)
            if not chunk:
                return None
            self._buffer += chunk
        return frames

    def _whole_frames(self) -> list[bytes]:
        frames, at = [], 0
        while len(self._buffer) - at >= HEADER.size:
            (size,) = HEADER.unpack_from(self._buffer, at)
            if len(self._buffer) - at - HEADER.size < size:
                break
            frames.append(bytes(self._buffer[at + HEADER.size : at + HEADER.size + size]))
            at += HEADER.size + size
        del self._buffer[:at]
        return frames


def run(resource: Resource, endpoint: str, fd: int) -> None:
    """Export every frame read from the pipe `fd` until it ends, as spans of `resource`."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    class FramesExporter(OTLPSpanExporter):
        """The SDK's OTLP/gRPC exporter, given frames of records instead of SDK spans."""

        # Frames in place of the SDK's spans: the overrides take what `export` is given.
        def _translate_data(  # type: ignore[override]
            self, data: Sequence[bytes]
        ) -> ExportTraceServiceRequest:
            return translate(data, resource)

        def _count_data(self, data: Sequence[bytes]) -> int:  # type: ignore[override]
            return len(data)  # frames, for the exporter's own metrics

    exporter = FramesExporter(endpoint=endpoint)
    try:
        batch = Batch(FrameReader(fd))
        while (frames := batch.next()) is not None:
            exporter.export(frames)  # type: ignore[arg-type]
    finally:
        exporter.shutdown()


class Batch:
    """Frames gathered into one export: those that arrive within EXPORT_SECONDS of the first
    one (everything left, once the pipe ends)."""

    def __init__(self, reader: FrameReader) -> None:
        self._reader = reader
        self._ended = False

    def next(self) -> list[bytes] | None:
        """The next export's frames; None once the pipe has ended and all were given."""
        if self._ended:
            return None
        first = self._reader.frames()
        if first is None:
            return None
        frames, due = first, time.monotonic() + EXPORT_SECONDS
        while (left := due - time.monotonic()) > 0:
            more = self._reader.frames(left)
            if more is None:
                self._ended = True
                break
            frames += more
        return frames


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m strata.telemetry.spanexport", description=__doc__
    )
    parser.add_argument(
        "--resource", required=True, help="the serving process's resource attributes, JSON"
    )
    parser.add_argument("--endpoint", required=True, help="the OTLP gRPC endpoint")
    args = parser.parse_args(argv)
    # The serving process's signals are not the child's to act on: it ends when its stdin
    # does, after the serving process's last spans (or at once, if that process was killed).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(CHILD_NICENESS)
    run(Resource(orjson.loads(args.resource)), args.endpoint, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
