"""A small OTLP/gRPC trace receiver that prints span trees: `make trace` on one machine.

Run it, point the services at it (`OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317`, or
`telemetry.otlp_endpoint` in the config), send requests, and it prints each trace as a tree of
spans with their service, duration and key attributes once the trace has been quiet for a
moment. Tests use the same receiver to check what the services export.
"""

from __future__ import annotations

import argparse
import threading
import time
from collections import OrderedDict
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

SHOWN_ATTRIBUTES = ("strata.", "rpc.grpc.status_code", "batch.", "error.")


def _value(value: AnyValue) -> object:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, object] = field(hash=False)
    links: tuple[str, ...] = ()
    status_code: int = 0
    events: tuple[str, ...] = ()

    @property
    def millis(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def spans_of(request: trace_service_pb2.ExportTraceServiceRequest) -> list[Span]:
    out = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope in resource_spans.scope_spans:
            out += [
                Span(
                    service=str(resource.get("service.name", "")),
                    name=s.name,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    links=tuple(link.span_id.hex() for link in s.links),
                    status_code=s.status.code,
                    events=tuple(e.name for e in s.events),
                )
                for s in scope.spans
            ]
    return out


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps the spans of the last `keep` traces, in arrival order."""

    def __init__(self, listen: str = "127.0.0.1:0", keep: int = 1000) -> None:
        self._keep = keep
        self._lock = threading.Lock()
        self._traces: OrderedDict[str, list[Span]] = OrderedDict()
        self._touched: dict[str, float] = {}
        # Without SO_REUSEPORT (gRPC's default): on a port another receiver holds, the bind
        # fails instead of splitting the spans between the two.
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4), options=[("grpc.so_reuseport", 0)]
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(listen)

    def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.ServicerContext,
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        now = time.monotonic()
        with self._lock:
            for span in spans_of(request):
                self._traces.setdefault(span.trace_id, []).append(span)
                self._traces.move_to_end(span.trace_id)
                self._touched[span.trace_id] = now
            while len(self._traces) > self._keep:
                old, _ = self._traces.popitem(last=False)
                self._touched.pop(old, None)
        return trace_service_pb2.ExportTraceServiceResponse()

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return list(self._traces.get(trace_id, []))

    def quiet_traces(self, quiet_seconds: float) -> list[str]:
        """Trace ids that received nothing for `quiet_seconds`, oldest first."""
        horizon = time.monotonic() - quiet_seconds
        with self._lock:
            return [t for t in self._traces if self._touched.get(t, 0) < horizon]

    def wait_for(self, trace_id: str, services: set[str], timeout: float = 15.0) -> list[Span]:
        """The spans of `trace_id` once every service in `services` has sent one and the
        tree is whole: each process exports on its own schedule, so a root can arrive
        after its children's spans from other services, or before them."""
        end = time.monotonic() + timeout
        spans = self.trace(trace_id)
        while time.monotonic() < end and not (
            services <= {s.service for s in spans} and len(roots(spans)) == 1
        ):
            time.sleep(0.05)
            spans = self.trace(trace_id)
        return spans

    def __enter__(self) -> Receiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0)


def roots(spans: list[Span]) -> list[Span]:
    """The spans whose parent is not among `spans`: one for a whole trace."""
    ids = {s.span_id for s in spans}
    return [s for s in spans if s.parent_id not in ids]


def render(spans: list[Span]) -> str:
    """The span tree of one trace, children indented under parents, in start order."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = {}
    for span in sorted(spans, key=lambda s: s.start_ns):
        parent = span.parent_id if span.parent_id in ids else ""
        children.setdefault(parent, []).append(span)
    lines = [f"trace {spans[0].trace_id}" if spans else "trace (empty)"]

    def walk(parent: str, depth: int) -> None:
        for span in children.get(parent, []):
            shown = {k: v for k, v in span.attributes.items() if k.startswith(SHOWN_ATTRIBUTES)}
            extra = " ".join(f"{k}={v}" for k, v in sorted(shown.items()))
            links = f" links={len(span.links)}" if span.links else ""
            error = " ERROR" if span.status_code == 2 else ""
            lines.append(
                f"{'  ' * depth}{span.service}: {span.name} {span.millis:.2f}ms"
                f"{error}{links} {extra}".rstrip()
            )
            walk(span.span_id, depth + 1)

    walk("", 1)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m strata.telemetry.traces", description=__doc__)
    parser.add_argument("--listen", default="127.0.0.1:4317", help="OTLP/gRPC address")
    parser.add_argument("--last", type=int, default=10, help="traces to print on exit")
    parser.add_argument("--seconds", type=float, default=0, help="stop after (0: Ctrl-C)")
    parser.add_argument("--follow", action="store_true", help="print each trace as it ends")
    args = parser.parse_args(argv)
    shown: set[str] = set()
    with Receiver(args.listen) as receiver:
        print(f"receiving OTLP traces on {args.listen}; Ctrl-C to stop", flush=True)
        end = time.monotonic() + args.seconds if args.seconds else float("inf")
        try:
            while time.monotonic() < end:
                time.sleep(0.5)
                if args.follow:
                    for trace_id in receiver.quiet_traces(1.0):
                        if trace_id not in shown:
                            shown.add(trace_id)
                            print(render(receiver.trace(trace_id)), flush=True)
        except KeyboardInterrupt:
            pass
        if not args.follow:
            for trace_id in receiver.quiet_traces(0)[-args.last :]:
                print(render(receiver.trace(trace_id)), flush=True)


if __name__ == "__main__":
    main()
