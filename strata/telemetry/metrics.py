"""Prometheus metrics: each process serves its own /metrics page when configured.

Metric objects live in the module that updates them, registered in prometheus_client's
default registry, which also carries the process collector (RSS, CPU seconds).

The same port answers container probes for next to nothing: `/livez` is 200 while the
process answers at all, `/readyz` 200 while its gRPC health service says SERVING (503 while
it starts or drains). `strata/tools/probe.py` asks it without importing the serving stack.

A process whose environment sets `STRATA_TRACE_MEMORY` (the operator's switch: no caller can
throw it) traces Python's allocations from the moment its page is served, its imports and
start-up behind it, and the page reports `strata_python_traced_bytes`: what Python holds,
after a full collection, of what it allocated since. A test or an operator hunting a leak
watches it from outside (tests/e2e/test_gateway_memory.py). Without the switch (or Python's
own PYTHONTRACEMALLOC) the page has no such metric and nothing is traced.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Generic, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    make_wsgi_app,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# Latency buckets (seconds) fine enough to read P50/P95/P99 of millisecond-scale hops.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
    1.024, 2.048, 4.096, 8.192,
)  # fmt: skip


READY = Gauge(
    "strata_ready",
    "1 while this process's gRPC health service says SERVING (of several workers: any).",
    multiprocess_mode="livemax",
)


class _Readiness:
    """What /readyz answers: set from the event loop, read by the HTTP thread."""

    serving = False


READINESS = _Readiness()


def set_ready(serving: bool) -> None:
    """Record whether the process's server is SERVING (its health service's overall status)."""
    READINESS.serving = serving
    READY.set(1 if serving else 0)


def _probes(metrics: WSGIApplication, ready: Callable[[], bool]) -> WSGIApplication:
    """/livez and /readyz answered from `ready`; every other path is metrics."""

    def app(environ: WSGIEnvironment, respond: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/livez", "/readyz"):
            return metrics(environ, respond)
        ok = path == "/livez" or ready()
        status = "200 OK" if ok else "503 Service Unavailable"
        respond(status, [("Content-Type", "text/plain")])
        return [b"ok\n" if ok else b"not serving\n"]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds would otherwise fill stderr."""


TRACE_MEMORY = "STRATA_TRACE_MEMORY"  # set in a process's environment: trace its allocations


class TracedMemory(Collector):
    """What Python holds, as tracemalloc counts it, while tracemalloc traces."""

    NAME = "strata_python_traced_bytes"
    HELP = "Bytes Python holds after a full collection, of what it allocated since tracing began."

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self.NAME, self.HELP)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        import tracemalloc  # here: a process that never traces never imports it

        if tracemalloc.is_tracing():
            gc.collect()  # cyclic garbage is not retained, only not yet freed
            held = tracemalloc.get_traced_memory()[0]
            yield GaugeMetricFamily(self.NAME, self.HELP, value=held)


REGISTRY.register(TracedMemory())


def serve_metrics(address: str | None) -> None:
    """Serve /metrics, /livez and /readyz on `address` (host:port) in a background thread,
    if one is set. OSError when the address cannot be bound."""
    if address:
        if os.environ.get(TRACE_MEMORY):
            import tracemalloc  # here: a process that never traces never imports it

            tracemalloc.start()
        _serve(address, make_wsgi_app(), lambda: READINESS.serving)


def serve_workers_metrics(address: str, folder: str) -> None:
    """Serve, from a parent of several workers, the sum of the metrics they write into
    `folder` (prometheus_client's multi-process mode); /readyz is 200 while any worker's
    health says SERVING."""
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=folder)

    def ready() -> bool:
        return any(
            sample.value >= 1
            for metric in registry.collect()
            if metric.name == "strata_ready"
            for sample in metric.samples
        )

    _serve(address, make_wsgi_app(registry), ready)


def _serve(address: str, metrics: WSGIApplication, ready: Callable[[], bool]) -> None:
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = {"address_family": socket.AF_INET6 if ":" in host else socket.AF_INET}
    kind = type("Server", (_Server,), family)
    server: WSGIServer = make_server(host, int(port), _probes(metrics, ready), kind, _Quiet)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    log.info("metrics on http://%s/metrics, probes on /livez and /readyz", address)


RPCS = Counter(
    "strata_rpc_server_requests",
    "RPCs this process answered, by method and status code.",
    ["method", "code"],
)
RPC_DURATION = Histogram(
    "strata_rpc_server_duration_seconds",
    "Time this process took to answer an RPC, by method.",
    ["method"],
    buckets=LATENCY_BUCKETS,
)


_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)


class Children(Generic[_Metric]):
    """A labelled metric's children, each resolved once: `labels()` takes a lock and builds
    its key on every call, which the hot path pays per request."""

    def __init__(self, metric: _Metric) -> None:
        self.metric: _Metric = metric
        self._children: dict[tuple[str, ...], _Metric] = {}

    def __call__(self, *values: str) -> _Metric:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child
