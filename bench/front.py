"""HAProxy as the gateway's front (deploy/front/haproxy.cfg), started here for a bench or a test.

The same configuration the compose file and the Kubernetes overlays run, with its values from
the environment: HAProxy listens plaintext h2c on a free loopback port, takes the gateway's
gRPC port as its one server, and asks the gateway's /readyz on its metrics port whether to
send it anything. `make run` needs none of this; only the overload bench (`--front`) and the
front's own check start it, and both skip without an `haproxy` on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.deployment import free_port

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "front" / "haproxy.cfg"
START_TIMEOUT = 10.0


@dataclass(frozen=True)
class FrontSettings:
    """What the front lets through: `places` requests in the gateway at once, the rest
    waiting at most `queue_ms` in the front's queue before it refuses them; a request that
    finds more queued than `rate` answers a second clear within that wait is refused on
    arrival."""

    places: int = 64
    queue_ms: int = 100
    rate: int = 1000


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
        "STRATA_FRONT_MAXCONN": str(settings.places),
        "STRATA_FRONT_QUEUE_MS": str(settings.queue_ms),
        "STRATA_FRONT_RATE": str(settings.rate),
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
