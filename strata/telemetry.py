"""Tracing and logging set-up, the same in every service.

Spans are always made, so W3C trace context flows through every hop; they leave the process
only when an OTLP endpoint is configured (or OTEL_EXPORTER_OTLP_ENDPOINT is set). Tests pass
their own provider.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

from opentelemetry import trace
from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    filters,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Status, StatusCode

from strata.config import TelemetrySettings

log = logging.getLogger(__name__)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, service, logger, message, trace and span ids."""

    converter = time.gmtime

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        event = {
            "ts": self.formatTime(record, "%Y-%m-%dT%H:%M:%S") + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            event["trace_id"] = format(context.trace_id, "032x")
            event["span_id"] = format(context.span_id, "016x")
        kind = getattr(record, "error_kind", None)
        if kind:
            event["error_kind"] = kind
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=False)


def setup_logging(service: str, level: str) -> None:
    """Structured JSON logs on stderr, one event per line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def setup_tracing(service: str, settings: TelemetrySettings) -> TracerProvider:
    """Install a tracer provider for `service`, exporting over OTLP if an endpoint is set."""
    sampler = None  # the SDK then honours OTEL_TRACES_SAMPLER / OTEL_TRACES_SAMPLER_ARG
    if "OTEL_TRACES_SAMPLER" not in os.environ:
        sampler = ParentBased(TraceIdRatioBased(settings.sample_ratio))
    provider = TracerProvider(resource=Resource.create({"service.name": service}), sampler=sampler)
    endpoint = settings.otlp_endpoint or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if endpoint:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        log.info("exporting traces to %s", endpoint)
    trace.set_tracer_provider(provider)
    return provider


def server_interceptors() -> list:
    """The OpenTelemetry aio server interceptor, skipping health checks."""
    return [aio_server_interceptor(filter_=filters.negate(filters.health_check()))]


def client_interceptors() -> list:
    """The OpenTelemetry aio client interceptors, injecting trace context into metadata."""
    return aio_client_interceptors()


def annotate(**attributes: object) -> None:
    """Set `strata.<name>` attributes on the current span (tuples/lists become arrays)."""
    span = trace.get_current_span()
    if span.is_recording():
        for key, value in attributes.items():
            span.set_attribute(f"strata.{key}", value)


def record_error(code_name: str, kind: str, message: str) -> None:
    """An error event on the current span, with its kind and whether a retry may help."""
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            "error",
            {
                "error.kind": kind,
                "error.code": code_name,
                "error.retryable": kind in ("retryable", "overload"),
                "error.message": message,
            },
        )
        span.set_status(Status(StatusCode.ERROR, f"{code_name}: {message}"))


def shapes(arrays: dict) -> list[str]:
    """Tensor shapes as span attribute values, e.g. ["images:1x8x8"]."""
    return [f"{name}:{'x'.join(map(str, a.shape))}" for name, a in arrays.items()]
