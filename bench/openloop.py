"""Open-loop load against a v2 endpoint, and the inference service run as its own process.

Open loop: requests leave at a fixed rate whether or not earlier ones have been answered, and
each latency runs from the moment its request was due to leave, so a slow server cannot hide
its queue by slowing the client down (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    """What one open-loop run saw."""

    offered: float  # requests per second sent
    seconds: float  # first send to last answer
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests only
    codes: Counter[str] = field(default_factory=Counter)

    @property
    def throughput(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")


async def open_loop(
    stub: v2_grpc.GRPCInferenceServiceStub,
    request: v2.ModelInferRequest,
    rate: float,
    duration: float,
    timeout: float,
) -> Run:
    """Send `request` at `rate` per second for `duration` seconds; wait for every answer."""
    loop = asyncio.get_running_loop()
    count = max(1, int(rate * duration))
    start = loop.time()
    run = Run(offered=rate, seconds=0.0)
    calls = []
    for i in range(count):
        due = start + i / rate
        if due > loop.time():
            await asyncio.sleep(due - loop.time())
        calls.append(asyncio.ensure_future(_one(stub, request, due, timeout, run)))
    await asyncio.gather(*calls)
    run.seconds = loop.time() - start
    return run


async def _one(
    stub: v2_grpc.GRPCInferenceServiceStub,
    request: v2.ModelInferRequest,
    due: float,
    timeout: float,
    run: Run,
) -> None:
    try:
        await stub.ModelInfer(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        run.codes[exc.code().name] += 1
        return
    run.codes["OK"] += 1
    run.latencies.append(asyncio.get_running_loop().time() - due)


async def saturate(
    stub: v2_grpc.GRPCInferenceServiceStub,
    request: v2.ModelInferRequest,
    concurrency: int,
    duration: float,
) -> float:
    """Closed-loop answers per second with `concurrency` requests always in flight."""
    loop = asyncio.get_running_loop()
    end = loop.time() + duration
    done = 0

    async def worker() -> None:
        nonlocal done
        while loop.time() < end:
            await stub.ModelInfer(request, timeout=30)
            done += 1

    start = loop.time()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return done / (loop.time() - start)


def serving(address: str, timeout: float) -> bool:
    """Whether the gRPC health service at `address` says SERVING within `timeout` seconds."""
    end = time.monotonic() + timeout
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < end:
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return True
            except grpc.RpcError:
                pass
            time.sleep(0.1)
    return False


def free_address() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


class ServiceProcess:
    """`python -m services.inference` on a free port: `start()` it, wait until `ready()`, and
    `stop()` it (SIGTERM, so it drains). As a context manager it does all three."""

    def __init__(self, config: Path, log: Path) -> None:
        self.address = free_address()
        self._config = config
        self._log = log
        self._process: subprocess.Popen | None = None

    def start(self) -> None:
        command = [
            *(sys.executable, "-m", "services.inference"),
            *("--config", str(self._config), "--listen", self.address),
        ]
        with self._log.open("ab") as log:
            self._process = subprocess.Popen(
                command, cwd=ROOT, stdout=log, stderr=log, env=dict(os.environ)
            )

    @property
    def pid(self) -> int:
        """The running service's process id."""
        assert self._process is not None, "the service is not started"
        return self._process.pid

    def ready(self, timeout: float = 120) -> None:
        if not serving(self.address, timeout):
            self.stop()
            raise RuntimeError(f"the inference service did not start; see {self._log}")

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None

    def __enter__(self) -> ServiceProcess:
        self.start()
        self.ready()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def settle(seconds: float = 0.2) -> None:
    """Let the last run's stragglers and the kernel's socket buffers drain."""
    time.sleep(seconds)
