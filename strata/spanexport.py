"""Spans exported off the serving path: a child process does the OTLP work.

Encoding a span for OTLP is pure Python in the SDK's exporter (about as costly as making the
span), and it runs under the serving process's GIL, where every microsecond is taken from
requests. Here the serving process only copies each finished span into a compact record and
writes a batch of them, as one JSON frame, to a child process's stdin; the child
(`python -m strata.spanexport`) turns the records back into the SDK's spans and exports them
with the SDK's own OTLP exporter, configured by the standard OTEL_EXPORTER_OTLP_* variables it
inherits. The SDK's BatchSpanProcessor stays in front: it batches, and drops spans once its
queue is full, so a slow or dead child never holds a request up. The child ends when its
stdin closes, on the serving process's shutdown or death.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import Any

import orjson
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.span import TraceState

log = logging.getLogger(__name__)
HEADER = struct.Struct(">I")  # a frame's length, then the frame
CHILD_EXIT_SECONDS = 5.0
READ_BYTES = 1 << 20  # at most, per read of the pipe


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
    return [
        span.name,
        _context(span.context),
        _context(span.parent) if span.parent is not None else None,
        span.kind.value,
        span.start_time,
        span.end_time,
        span.status.status_code.value,
        span.status.description,
        dict(span.attributes or {}),
        [[e.name, e.timestamp, dict(e.attributes or {})] for e in span.events],
        [[_context(k.context), dict(k.attributes or {})] for k in span.links],
        [scope.name, scope.version] if scope is not None else None,
    ]


def encode(spans: Sequence[ReadableSpan]) -> bytes:
    """One frame: the spans' records."""
    body = orjson.dumps([_record(span) for span in spans])
    return HEADER.pack(len(body)) + body


class ChildSpanExporter(SpanExporter):
    """A SpanExporter that hands spans to a child exporter process (module docstring)."""

    def __init__(self, resource: Resource, endpoint: str) -> None:
        attributes = orjson.dumps(dict(resource.attributes)).decode()
        command = ("-m", "strata.spanexport", "--resource", attributes, "--endpoint", endpoint)
        self._child = subprocess.Popen([sys.executable, *command], stdin=subprocess.PIPE)
        self._lock = threading.Lock()  # export and shutdown may come from two threads
        self._failed = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        frame = encode(spans)
        with self._lock:
            try:
                self._child.stdin.write(frame)
                self._child.stdin.flush()
            except (OSError, ValueError):  # the child is gone, or shut down
                if not self._failed:
                    log.warning("the span exporter process has exited: spans are dropped")
                self._failed = True
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        with self._lock, contextlib.suppress(OSError):
            self._child.stdin.close()
        try:
            self._child.wait(CHILD_EXIT_SECONDS)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


# The child's side.


def _span_context(fields: list[Any]) -> SpanContext:
    trace_id, span_id, remote, flags, state = fields
    return SpanContext(
        int(trace_id, 16),
        int(span_id, 16),
        is_remote=remote,
        trace_flags=TraceFlags(flags),
        trace_state=TraceState.from_header([state]) if state else None,
    )


def decode(body: bytes, resource: Resource) -> list[ReadableSpan]:
    """The SDK's spans back from one frame's records."""
    spans = []
    for record in orjson.loads(body):
        name, context, parent, kind, start, end, code, text, attributes, events, links, scope = (
            record
        )
        spans.append(
            ReadableSpan(
                name=name,
                context=_span_context(context),
                parent=_span_context(parent) if parent is not None else None,
                resource=resource,
                attributes=attributes,
                events=[Event(n, a, timestamp=t) for n, t, a in events],
                links=[Link(_span_context(c), a) for c, a in links],
                kind=SpanKind(kind),
                status=Status(StatusCode(code), text),
                start_time=start,
                end_time=end,
                instrumentation_scope=InstrumentationScope(*scope) if scope else None,
            )
        )
    return spans


class FrameReader:
    """Frames from a pipe: each read takes whatever has arrived, so frames written while the
    last export ran are exported together."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()

    def frames(self) -> list[bytes] | None:
        """Every whole frame that has arrived (waiting for one); None once the pipe ends."""
        while not (frames := self._whole_frames()):
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

    exporter = OTLPSpanExporter(endpoint=endpoint)
    try:
        reader = FrameReader(fd)
        while (frames := reader.frames()) is not None:
            spans = [span for body in frames for span in decode(body, resource)]
            exporter.export(spans)
    finally:
        exporter.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m strata.spanexport", description=__doc__)
    parser.add_argument(
        "--resource", required=True, help="the serving process's resource attributes, JSON"
    )
    parser.add_argument("--endpoint", required=True, help="the OTLP gRPC endpoint")
    args = parser.parse_args(argv)
    # The serving process's signals are not the child's to act on: it ends when its stdin
    # does, after the serving process's last spans (or at once, if that process was killed).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    run(Resource(orjson.loads(args.resource)), args.endpoint, sys.stdin.fileno())
    return 0


if __name__ == "__main__":
    sys.exit(main())
