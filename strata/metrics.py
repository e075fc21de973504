"""Prometheus metrics: each process serves its own /metrics page when configured.

Metric objects live in the module that updates them, registered in prometheus_client's
default registry, which also carries the process collector (RSS, CPU seconds).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

log = logging.getLogger(__name__)

# Latency buckets (seconds) fine enough to read P50/P95/P99 of millisecond-scale hops.
LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512,
    1.024, 2.048, 4.096, 8.192,
)  # fmt: skip


def serve_metrics(address: str | None) -> None:
    """Serve /metrics on `address` (host:port) in a background thread, if one is set."""
    if not address:
        return
    host, _, port = address.rpartition(":")
    start_http_server(int(port), addr=host)
    log.info("metrics on http://%s/metrics", address)


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


class Children:
    """A labelled metric's children, each resolved once: `labels()` takes a lock and builds
    its key on every call, which the hot path pays per request."""

    def __init__(self, metric: Counter | Gauge | Histogram) -> None:
        self.metric = metric
        self._children: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = self.metric.labels(*values)
        return child
