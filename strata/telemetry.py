"""Tracing and logging set-up, the same in every service.

Spans are always made, so W3C trace context flows through every hop; they leave the process
only when an OTLP endpoint is configured (or OTEL_EXPORTER_OTLP_ENDPOINT is set). Tests pass
their own provider.
"""

from __future__ import annotations

import logging
import os
import sys

from opentelemetry import trace
from opentelemetry.instrumentation.grpc import (
    aio_client_interceptors,
    aio_server_interceptor,
    filters,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from strata.config import TelemetrySettings

log = logging.getLogger(__name__)


def setup_logging(service: str, level: str) -> None:
    """One line per event on stderr, naming the service."""
    logging.basicConfig(
        stream=sys.stderr,
        level=level.upper(),
        format=f"%(asctime)s {service} %(levelname)s %(name)s: %(message)s",
    )


def setup_tracing(service: str, settings: TelemetrySettings) -> TracerProvider:
    """Install a tracer provider for `service`, exporting over OTLP if an endpoint is set."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
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
