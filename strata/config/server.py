"""What every process shares: gRPC server behaviour, tracing and logs."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from strata.calls.streams import DEFAULT_MAX_IN_FLIGHT
from strata.config.base import LIVE, Strict


class SlabSettings(Strict):
    """Big tensors between the layers of one host through shared memory (strata.wire.slab)."""

    enabled: bool = Field(
        default=True,
        description="Big tensors between layers of one host go through shared memory: "
        "preprocess writes its crops, and the gateway its model inputs, into a slab of its "
        "own under `root` and names the bytes in the message; the receiver copies them out. "
        "Bytes go in the message instead where the receiver is on another host or does not "
        "share `root`, the tensor is smaller than min_bytes, or the slab is full, so it is on "
        "by default; turn it off where no layer shares the host's `root` (separate containers), "
        "which saves each sending process its slab (docs/deploy.md#shared-memory-between-layers).",
    )
    root: Path = Field(
        default=Path("/dev/shm"),
        description="The folder of the slabs: a memory-backed file system every layer of the "
        "host mounts (Docker: shm_size, or a shared volume; Kubernetes: an emptyDir of medium "
        "Memory).",
    )
    size_mib: int = Field(
        default=16,
        gt=0,
        description="Each sending process's slab, reserved at start-up: what it may have in "
        "flight at once (a 224x224 UINT8 crop is 147 KiB). Docker's default /dev/shm is 64 MiB "
        "for the whole container.",
    )
    min_bytes: int = Field(
        default=65536,
        ge=0,
        description="Smaller tensors go in the message: below this, gRPC carries the bytes "
        "about as cheaply as the slab's bookkeeping.",
    )
    lease_seconds: float = Field(
        default=30.0,
        gt=0,
        description="How long a block waits for its receiver before the sender takes it back "
        "(a receiver that dropped the message never releases it); a receiver that reads a "
        "block after that is refused, never given another block's bytes.",
    )


class PipeSettings(Strict):
    """Stream messages between the layers of one host over Unix sockets (strata.rpc.pipes)."""

    enabled: bool = Field(
        default=True,
        description="Each internal layer also serves its stream methods (ProcessStream, "
        "ModelStreamInfer) on a Unix socket under `root`, which only its own user may open, "
        "and the gateway's lanes to a layer of its host use it: a message there costs a "
        "fraction of a gRPC stream's. Where the socket is not there (another host, another "
        "container, another user), or off, the lanes use gRPC as before "
        "(docs/deploy.md#pipes-between-layers).",
    )
    root: Path = Field(
        default=Path("/dev/shm"),
        description="Where the sockets go: in a folder of the user's own "
        "(strata-pipes-<uid>, mode 0700) that every layer of the host must see. Keep it "
        "short: a socket's whole path holds at most 107 bytes (a layer whose path is longer "
        "says so and serves over gRPC alone).",
    )
    max_connections: int = Field(
        default=64,
        gt=0,
        description="Callers one layer's socket holds at once; a caller past it is closed "
        "at once and its lane goes over gRPC.",
    )


class ServerSettings(Strict):
    """Behaviour every gRPC server shares."""

    grace_seconds: float = Field(default=5.0, gt=0, description="Drain time after SIGTERM.")
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest gRPC message sent or received."
    )
    max_concurrent_streams: int = Field(
        default=256,
        gt=0,
        description="Calls one client connection may have open at once, on every port (the "
        "gateway's public one included): a gRPC client holds any more until one ends (HTTP/2 "
        "flow control), so they wait in the client, at no cost to the server, and are never "
        "refused by HTTP/2. Those open are queued at the gateway's door and answered; past "
        "capacity the door refuses with RESOURCE_EXHAUSTED and a retry hint.",
    )
    overload_protection: bool = Field(
        default=False,
        description="gRPC core's own stream refusal: a new stream is refused (RST_STREAM, "
        "UNAVAILABLE to the caller) while the streams the server has not yet freed, finished "
        "ones included, exceed max_concurrent_streams. A server frees them late, so it refused "
        "clients that kept within the limit (a closed loop of 256 on one connection, the "
        "limit, lost 3 of 6,904 calls in 3 s on a bare server); off, the client holds the "
        "excess itself. On, an open loop far past capacity is partly refused in C before "
        "any Python runs, at that price (docs/gateway.md).",
    )
    max_stream_in_flight: int = Field(
        default=DEFAULT_MAX_IN_FLIGHT,
        gt=0,
        description="Messages of one stream (ModelStreamInfer, ProcessStream) unanswered at "
        "once; past it the server stops reading that stream until one is answered, so a "
        "client that writes without reading holds at most this much of the server's memory. "
        "A decoupled pipeline's request counts once, until the client has taken all its "
        "responses (at most its decoupled.max_responses).",
    )
    event_loop: Literal["uvloop", "asyncio"] = Field(
        default="uvloop",
        description="The event loop a service runs on: uvloop (libuv's, in C) or asyncio's "
        "own. uvloop cost the pipeline 5-10% less CPU a request on a 2-core VM (3.1 to 2.8 ms "
        "at one request in flight); asyncio is there should a platform lack uvloop.",
    )
    max_concurrent_rpcs: int = Field(
        default=2048,
        gt=0,
        description="Calls one server runs at once, idle streams included; any beyond it is "
        "refused at once (RESOURCE_EXHAUSTED, before a handler runs): the backstop behind "
        "the gateway's adaptive concurrency limit, so a backlog cannot grow without bound. "
        "Health checks, ServerLive and ServerReady are not counted: they have capacity of "
        "their own.",
    )
    max_calls_per_client: int | None = Field(
        default=None,
        gt=0,
        description="Calls one client address may have open at once on a public port (the "
        "gateway's), idle streams included, and REST connections it may hold; past it that "
        "address is refused (RESOURCE_EXHAUSTED; REST 503, closed) while others are served. "
        "Unset, one address may take all of max_concurrent_rpcs (a load test from one machine "
        "does); the shipped deploy config sets it. Health checks, ServerLive and ServerReady "
        "count against no limit.",
    )
    idle_connection_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A public port closes a client connection that has had no call open for "
        "this long (gRPC's max_connection_idle; REST's keep-alive is 5 s).",
    )
    handshake_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A connection must finish its TLS and HTTP/2 handshake within this long, "
        "or it is closed (gRPC's own default is 120 s; a client that connects and sends "
        "nothing held its connection that long).",
    )
    accept_compressed: bool = Field(
        default=False,
        description="Accept gzip- or deflate-compressed gRPC messages. gRPC inflates a whole "
        "message before checking max_message_bytes (0.25 MiB inflated to 256 MiB of server "
        "memory), so off (the default) they are refused UNIMPLEMENTED before inflating; turn "
        "it on only where every caller is trusted.",
    )
    reflection: bool = Field(
        default=True,
        description="Serve gRPC server reflection (grpcurl lists the services without their "
        "protos). Handy in development; the shipped deploy config turns it off, since it tells "
        "anyone who reaches a port what it serves.",
    )
    slab: SlabSettings = Field(
        default_factory=SlabSettings,
        description="Big tensors between the layers of one host through shared memory.",
    )
    pipes: PipeSettings = Field(
        default_factory=PipeSettings,
        description="Stream messages between the layers of one host over Unix sockets.",
    )
    max_connection_age_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Internal services ask callers to reconnect after this long, so they "
        "re-resolve DNS and spread over replicas added since (in-flight calls finish first).",
    )


def grpc_options(settings: ServerSettings) -> list[tuple[str, int]]:
    """Channel arguments servers and channels share (here, below both, so that a channel,
    as the launcher's health checks open, does not load the serving stack)."""
    return [
        ("grpc.max_send_message_length", settings.max_message_bytes),
        ("grpc.max_receive_message_length", settings.max_message_bytes),
    ]


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
        "is always kept); OTEL_TRACES_SAMPLER overrides. The gateway decides for the chain, "
        "and a Reload applies a new one there live, over trace settings changed through "
        "Triton's TraceSetting.",
        json_schema_extra=LIVE,
    )
