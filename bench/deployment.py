"""The system under test: a deployment config on free loopback ports, run by strata.tools.launch.

The benchmarks measure the config they are given, changed only where one machine and a
benchmark need it: every service on a free port (replica counts kept), no metrics ports (but
the gateway's, when a benchmark reads it), an admin token so the benchmark can read the
gateway's status, and trace export on or off.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import yaml
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from strata.config import Settings, load_settings
from strata.tools.launch import Supervisor, start_on_fresh_ports

START_TIMEOUT = 120.0  # seconds for every service to say SERVING (model loading, warm-up)


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive loopback ports that are free now."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count <= 65535 and all(_free(p) for p in range(base + 1, base + count)):
            return base


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _endpoint(replicas: int = 1) -> dict[str, Any]:
    return {"listen": f"127.0.0.1:{free_port(replicas)}", "replicas": replicas}


def bench_config(
    config: Path,
    folder: Path,
    admin_token: str,
    otlp_endpoint: str | None = None,
    gateway: dict[str, Any] | None = None,
    gateway_metrics: bool = False,
    sample_ratio: float | None = None,
    gateway_admin: bool = False,
    preprocess_metrics: bool = False,
) -> Path:
    """`config` on free ports (REST too, and the gateway's and the preprocess replicas'
    metrics pages if asked) with an admin token, tracing as asked (`sample_ratio`: of new
    traces, None for the config's) and the `gateway` settings given replaced, written into
    `folder`."""
    settings = load_settings(config)
    raw = yaml.safe_load(Path(config).read_text())
    raw["repository"] = str(settings.repository)
    services = settings.services
    front = {**_endpoint(), "rest": f"127.0.0.1:{free_port()}"}
    if gateway_metrics:
        front["metrics"] = f"127.0.0.1:{free_port()}"
    if gateway_admin:
        front["admin_listen"] = f"127.0.0.1:{free_port()}"
    preprocess = _endpoint(services.preprocess.replicas)
    if preprocess_metrics:  # a page for each replica, on consecutive ports
        preprocess["metrics"] = f"127.0.0.1:{free_port(services.preprocess.replicas)}"
    raw["services"] = {
        "gateway": front,
        "preprocess": preprocess,
        "postprocess": _endpoint(services.postprocess.replicas),
        "inference": {name: _endpoint(e.replicas) for name, e in services.inference.items()},
    }
    raw["gateway"] = {**(raw.get("gateway") or {}), **(gateway or {}), "admin_token": admin_token}
    telemetry = raw.setdefault("telemetry", {})
    telemetry["otlp_endpoint"] = otlp_endpoint
    telemetry["log_level"] = "WARNING"  # the benchmark's cost, not the logs', is measured
    if sample_ratio is not None:
        telemetry["sample_ratio"] = sample_ratio
    # Stopping fast matters to a benchmark; draining behaviour is not what it measures.
    raw.setdefault("server", {})["grace_seconds"] = min(settings.server.grace_seconds, 2.0)
    path = folder / "bench.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path


@contextmanager
def running(
    config: Path,
    folder: Path,
    otlp_endpoint: str | None = None,
    gateway: dict[str, Any] | None = None,
    gateway_metrics: bool = False,
    sample_ratio: float | None = None,
    gateway_admin: bool = False,
    preprocess_metrics: bool = False,
) -> Iterator[tuple[Supervisor, str]]:
    """Every service of `config` as processes on free ports: (supervisor, admin token)."""
    token = secrets.token_hex(16)
    # Without a collector configured nothing is exported, so the variable must not leak in.
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_endpoint or "",
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }

    def build() -> Supervisor:  # on new free ports each time
        path = bench_config(
            config,
            folder,
            token,
            otlp_endpoint,
            gateway,
            gateway_metrics,
            sample_ratio,
            gateway_admin,
            preprocess_metrics,
        )
        return Supervisor(path, load_settings(path), log_dir=folder, env=env)

    supervisor = start_on_fresh_ports(build, START_TIMEOUT)
    try:
        yield supervisor, token
    finally:
        supervisor.stop_all()


def inference_address(settings: Settings, deployment: str) -> str:
    """Where one inference deployment's first replica listens."""
    return settings.services.inference[deployment].listens[0]


def service_pids(supervisor: Supervisor) -> dict[str, int]:
    """Each running instance's process id, by instance name."""
    return {name: process.pid for name, process in supervisor.processes.items()}


class CountingReceiver:
    """The OTLP/gRPC endpoint that tracing-on runs export to: it keeps each export's bytes as
    they came and counts the spans in them only when asked, after the run. A collector runs on
    other machines in a deployment; here it shares the benchmark's two cores, so it does no
    more work while the system is measured than receiving (strata.telemetry.traces.Receiver, which
    decodes every span into Python objects as it comes, took 0.13 ms of CPU per request)."""

    def __init__(self) -> None:
        self._exports: list[bytes] = []
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        handler = grpc.method_handlers_generic_handler(
            trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name,
            {"Export": grpc.unary_unary_rpc_method_handler(self._export)},
        )
        self._server.add_generic_rpc_handlers((handler,))
        self.port = self._server.add_insecure_port("127.0.0.1:0")

    def _export(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        self._exports.append(request)  # list.append is atomic under the GIL
        return b""  # an empty ExportTraceServiceResponse

    @property
    def spans(self) -> int:
        """How many spans have been received."""
        total = 0
        for raw in list(self._exports):
            request = trace_service_pb2.ExportTraceServiceRequest.FromString(raw)
            total += sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        return total

    def __enter__(self) -> CountingReceiver:
        self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop(0)
