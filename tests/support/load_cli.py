"""`python -m bench.load` run as a user runs it, for the load tool's tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from concurrent import futures

import grpc

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import ROOT


def run(call: Sequence[str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The tool with `call` (its target options) and `args`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "bench.load", *call, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_report(call: Sequence[str], *args: str) -> dict:
    """The tool's JSON report of a run that succeeded."""
    done = run(call, *args, "-O", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def serve(servicer: v2_grpc.GRPCInferenceServiceServicer, workers: int = 8) -> Iterator[str]:
    """A v2 server of `servicer` on a free loopback port, for the tool to send to: its
    address, until the generator is closed."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
    v2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(0)
