"""HAProxy as the gateway's front (deploy/front/haproxy.cfg), started here for a bench or a test.

The same configuration the compose file and the Kubernetes overlays run, with its values from
the environment: HAProxy listens plaintext h2c on a free loopback port, takes the gateway's
gRPC port as its one server, and asks the gateway's /readyz on its metrics port whether to
send it anything. `make run` needs none of this; only the overload bench (`--front`) and the
front's own check start it, and both skip without an `haproxy` on PATH.
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.deployment import free_port

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "front" / "haproxy.cfg"
START_TIMEOUT = 10.0
# Shares of the latency objective an admitted call may spend past capacity: in the gateway
# (its places, at capacity, take places / capacity to clear) and in the front's queue (which
# holds at most a wait's worth of answers). Their sum leaves the rest of the objective for
# the tail of the gateway's own time.
IN_GATEWAY = 0.2
QUEUED = 0.05


@dataclass(frozen=True)
class FrontSettings:
    """What the front lets through: `places` requests in the gateway at once, the rest
    waiting at most `queue_ms` in the front's queue before it refuses them; a request that
    finds more queued than `rate` answers a second clear within that wait is refused on
    arrival."""

    # Sized for a gateway of 1,000 answers a second and the default 250 ms objective, as the
    # deployments are until a measured capacity replaces them.
    places: int = 50
    queue_ms: int = 12
    rate: int = 1000
    threads: int | None = None  # HAProxy's threads; None: the config's default, one

    @classmethod
    def sized(
        cls,
        capacity: float,
        objective_seconds: float,
        in_gateway: float = IN_GATEWAY,
        queued: float = QUEUED,
    ) -> FrontSettings:
        """A front for a gateway that answers `capacity` calls a second, so that past
        capacity an admitted call spends at most `in_gateway` of the objective in the
        gateway and `queued` of it in the front's queue (Little's law: places = capacity x
        the time in the gateway; the queue's bound, rate x wait, follows from the rate).
        `capacity` is what the gateway clears past capacity, where clients and the front
        take cores too (`bench.overload --front` measures it behind the front at 2x); a
        closed loop's rate overstates it and the places with it."""
        if capacity <= 0 or objective_seconds <= 0:
            raise ValueError("a front is sized from a positive capacity and objective")
        return cls(
            # Rounded first, so that a product meant whole (380/s x 50 ms) is not one more.
            places=max(1, math.ceil(round(capacity * objective_seconds * in_gateway, 6))),
            queue_ms=max(1, round(objective_seconds * queued * 1000)),
            rate=max(1, round(capacity)),
        )

    def variables(self) -> dict[str, str]:
        """The sizing as the variables a deployment sets (compose, Kubernetes)."""
        variables = {
            "STRATA_FRONT_MAXCONN": str(self.places),
            "STRATA_FRONT_QUEUE_MS": str(self.queue_ms),
            "STRATA_FRONT_RATE": str(self.rate),
        }
        if self.threads is not None:
            variables["STRATA_FRONT_THREADS"] = str(self.threads)
        return variables


def haproxy() -> str | None:
    """The haproxy binary, if one is installed."""
    return shutil.which("haproxy")


def environment(listen: str, gateway: str, readyz: str, settings: FrontSettings) -> dict:
    """The variables deploy/front/haproxy.cfg reads."""
    host, _, port = readyz.rpartition(":")
    return {
        "STRATA_FRONT_LISTEN": listen,
        "STRATA_GATEWAY": gateway,
        "STRATA_GATEWAY_READYZ_HOST": host,
        "STRATA_GATEWAY_READYZ_PORT": port,
        **settings.variables(),
    }


@contextmanager
def front(
    gateway: str,
    readyz: str,
    settings: FrontSettings = FrontSettings(),
    metrics: str | None = None,
) -> Iterator[str]:
    """HAProxy before `gateway` (host:port, plaintext gRPC) whose /readyz is at `readyz`
    (host:port), its Prometheus page at `metrics` (host:port) if given; yields the front's
    address once a call through it is answered."""
    binary = haproxy()
    if binary is None:
        raise RuntimeError("no haproxy on PATH (Debian: apt-get install haproxy)")
    listen = f"127.0.0.1:{free_port()}"
    env = {**os.environ, **environment(listen, gateway, readyz, settings)}
    if metrics is not None:
        env["STRATA_FRONT_METRICS"] = metrics
    # -db: in the foreground, so that it stops with this process; -W: master-worker.
    process = subprocess.Popen([binary, "-db", "-W", "-f", str(CONFIG)], env=env)
    try:
        _wait_serving(listen, process)
        yield listen
    finally:
        process.terminate()
        process.wait(10)


def _wait_serving(listen: str, process: subprocess.Popen) -> None:
    """Until a health check through the front is answered: HAProxy up, and the gateway
    marked up by its first /readyz."""
    deadline = time.monotonic() + START_TIMEOUT
    with grpc.insecure_channel(listen) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"haproxy exited ({process.returncode}) at start")
            try:
                stub.Check(health_pb2.HealthCheckRequest(), timeout=1)
                return
            except grpc.RpcError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the front did not answer within {START_TIMEOUT:g} s"
                    ) from exc
                time.sleep(0.1)


def counters(metrics: str) -> dict[str, float]:
    """The front's counters for the gateway, backend and server, from its Prometheus page at
    `metrics` (host:port), by name (haproxy_backend_..., haproxy_server_...)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
        lines = page.read().decode().splitlines()
    return {
        line.partition("{")[0]: float(line.rpartition(" ")[2])
        for line in lines
        if line.startswith(("haproxy_backend_", "haproxy_server_"))
        and 'proxy="gateway"' in line.partition(" ")[0]
    }
