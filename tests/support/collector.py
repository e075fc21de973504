"""A minimal OTLP/gRPC trace collector in the test process: it keeps what it receives."""

from __future__ import annotations

import threading
import time
from concurrent import futures
from dataclasses import dataclass

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class Span:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[Span] = []
        self._lock = threading.Lock()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def Export(self, request, context):
        with self._lock:
            for resource_spans in request.resource_spans:
                attrs = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    self.spans += [
                        Span(
                            attrs.get("service.name", ""),
                            s.name,
                            s.trace_id.hex(),
                            s.span_id.hex(),
                            s.parent_span_id.hex(),
                        )
                        for s in scope.spans
                    ]
        return trace_service_pb2.ExportTraceServiceResponse()

    def wait_for(self, trace_id: str, services: set[str], timeout: float = 15.0) -> list[Span]:
        """The spans of `trace_id`, once every service in `services` has sent one."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self._lock:
                spans = [s for s in self.spans if s.trace_id == trace_id]
            if services <= {s.service for s in spans}:
                return spans
            time.sleep(0.1)
        return spans

    def __enter__(self) -> Collector:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0)
