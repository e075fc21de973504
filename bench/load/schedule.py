"""A load run's plan, and how it is shared out among the worker processes.

Open loop: request `i` of the run is due at `i / rps` seconds after the start, whatever
happened to the requests before it; worker `k` of `W` sends requests `k, k + W, k + 2W ...`,
so together the workers keep one fixed arrival rate. Closed loop: each worker runs its share
of the concurrent clients, and of the total when one is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from bench.load.options import DEFAULT_CONCURRENCY, DEFAULT_TOTAL
from bench.load.rest import is_url
from bench.load.transport import Tls


@dataclass(frozen=True)
class Plan:
    """What to send, where, and how fast: one load run for the whole pool."""

    target: str  # gRPC: host:port; HTTP: the origin, http://host:port
    method: str  # gRPC: the path, /package.Service/Method; HTTP: /v2/models/NAME/infer
    requests: tuple[bytes, ...]  # serialized messages (HTTP: v2 JSON bodies), sent in turn
    metadata: tuple[tuple[str, str], ...] = ()
    timeout: float | None = 20.0  # None: no deadline, as a client library sets by default
    connect_timeout: float = 10.0
    connections: int = 1  # gRPC: each carries many requests at once; HTTP/1.1: one at a time
    rps: float | None = None  # open loop when set
    total: int | None = None
    duration: float | None = None  # overrides total, as in ghz
    concurrency: int | None = None  # closed loop: clients; open loop: the most in flight
    inspect: bool = True  # read v2 response parameters (degraded, cached answers)
    tls: Tls | None = None  # None: plaintext
    sender: str = "auto"  # compiled (build/load-sender), python, or auto: compiled where it can

    @property
    def open_loop(self) -> bool:
        return self.rps is not None

    @property
    def http(self) -> bool:
        """Sent as HTTP/1.1 POSTs to a v2 REST endpoint rather than as gRPC calls."""
        return is_url(self.target)

    @property
    def expected(self) -> int | None:
        """Requests the run will send, when known in advance."""
        if self.open_loop:
            return open_count(self)
        return None if self.duration else (self.total or DEFAULT_TOTAL)


@dataclass(frozen=True)
class Job:
    """One worker's share of a plan."""

    plan: Plan
    offset: int  # this worker sends global request indices offset, offset + stride, ...
    stride: int
    connections: int
    concurrency: int | None  # closed loop: clients here; open loop: in-flight cap here
    count: int | None  # open loop: the run's count; closed loop: this worker's share


def open_count(plan: Plan) -> int:
    """Requests an open-loop run sends: rps times duration, else the total."""
    if plan.duration is not None:
        # Rounded first, so that 100/s for 0.55 s is 55 requests, not 56.
        return max(1, math.ceil(round(plan.rps * plan.duration, 6)))
    return plan.total or DEFAULT_TOTAL


def share(amount: int, parts: int, index: int) -> int:
    """Part `index` of `amount` split as evenly as whole numbers allow."""
    return amount // parts + (1 if index < amount % parts else 0)


def split(plan: Plan, workers: int) -> list[Job]:
    """One job per worker that has something to do (never more workers than requests)."""
    if not plan.requests:
        raise ValueError("a plan needs at least one request message")
    if plan.open_loop:
        return _split_open(plan, workers)
    return _split_closed(plan, workers)


def _split_open(plan: Plan, workers: int) -> list[Job]:
    count = open_count(plan)
    active = max(1, min(workers, count))
    cap = plan.concurrency
    if cap is not None:
        active = min(active, cap)
    return [
        Job(
            plan=plan,
            offset=k,
            stride=active,
            connections=max(1, share(plan.connections, active, k)),
            concurrency=share(cap, active, k) if cap is not None else None,
            count=count,
        )
        for k in range(active)
    ]


def _split_closed(plan: Plan, workers: int) -> list[Job]:
    clients = plan.concurrency or DEFAULT_CONCURRENCY
    total = None if plan.duration else (plan.total or DEFAULT_TOTAL)
    active = max(1, min(workers, clients, total or clients))
    return [
        Job(
            plan=plan,
            offset=k,
            stride=active,
            connections=max(1, share(plan.connections, active, k)),
            concurrency=share(clients, active, k),
            count=share(total, active, k) if total is not None else None,
        )
        for k in range(active)
    ]


def with_rate(plan: Plan, rps: float, duration: float) -> Plan:
    """The same plan as an open-loop run at `rps` for `duration` seconds."""
    return replace(plan, rps=rps, duration=duration, total=None)
