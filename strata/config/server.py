"""What every process shares: gRPC server behaviour, tracing and logs."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from strata.config.base import Strict


class ServerSettings(Strict):
    """Behaviour every gRPC server shares."""

    grace_seconds: float = Field(default=5.0, gt=0, description="Drain time after SIGTERM.")
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest gRPC message sent or received."
    )
    max_concurrent_streams: int = Field(
        default=256, gt=0, description="Calls one client connection may have open at once."
    )
    public_max_concurrent_streams: int = Field(
        default=16,
        gt=0,
        description="The same on the gateway's public port. Past capacity, calls beyond it are "
        "refused by HTTP/2 itself (REFUSED_STREAM, which clients see as UNAVAILABLE) before any "
        "Python runs, so a backlog cannot build inside gRPC where no handler sees it; a client "
        "that needs more calls in flight opens more connections (channels).",
    )
    max_concurrent_rpcs: int = Field(
        default=2048,
        gt=0,
        description="Calls one server runs at once, health checks included; gRPC refuses any "
        "beyond it at once (RESOURCE_EXHAUSTED, before a handler runs): the backstop behind "
        "the gateway's adaptive concurrency limit, so a backlog cannot grow without bound.",
    )
    max_connection_age_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Internal services ask callers to reconnect after this long, so they "
        "re-resolve DNS and spread over replicas added since (in-flight calls finish first).",
    )


class TelemetrySettings(Strict):
    """Tracing; exporting happens only when an OTLP endpoint is set."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/gRPC collector; OTEL_EXPORTER_OTLP_ENDPOINT also works.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level for every service (JSON lines on stderr)."
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Share of new traces sampled (parent-based: a sampled caller's trace "
        "is always kept); OTEL_TRACES_SAMPLER overrides.",
    )
