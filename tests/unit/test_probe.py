"""The cheap container probe: /livez and /readyz on the metrics port, asked by strata/tools/probe.py
with nothing but a socket (on a loopback port)."""

from __future__ import annotations

import ast
import asyncio
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2

from strata.config.server import ServerSettings
from strata.rpc.server import start_server
from strata.telemetry import metrics
from strata.tools import probe
from tests.support.system import ROOT, free_port

PROBE = ROOT / "strata" / "tools" / "probe.py"


@pytest.fixture(scope="module")
def address() -> str:
    """A metrics page on a free loopback port, for this module (its thread is a daemon)."""
    address = f"127.0.0.1:{free_port()}"
    metrics.serve_metrics(address)
    return address


@pytest.fixture
def ready() -> Iterator[None]:
    metrics.set_ready(True)
    yield
    metrics.set_ready(False)


def run_probe(*args: str) -> subprocess.CompletedProcess:
    """The probe as a container runs it: a file, isolated, without site-packages."""
    command = [sys.executable, "-I", "-S", str(PROBE), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=10)


def test_readyz_says_whether_the_server_is_serving(address: str, ready: None) -> None:
    assert probe.status(address) == 200
    assert run_probe(address).returncode == 0
    metrics.set_ready(False)
    assert probe.status(address) == 503
    refused = run_probe(address)
    assert (refused.returncode, refused.stderr) == (1, f"{address}/readyz: HTTP 503\n")


def test_livez_answers_while_the_process_does(address: str) -> None:
    assert probe.status(address, "/livez") == 200
    assert run_probe(address, "/livez").returncode == 0


def test_the_metrics_page_is_still_served_and_shows_readiness(address: str, ready: None) -> None:
    with urllib.request.urlopen(f"http://{address}/metrics") as page:
        assert "strata_ready 1.0" in page.read().decode()


def test_nothing_listening_is_a_failure_with_the_reason() -> None:
    address = f"127.0.0.1:{free_port()}"
    refused = run_probe(address)
    assert refused.returncode == 1
    assert refused.stderr.startswith(f"{address}/readyz: ")
    assert "refused" in refused.stderr


def test_the_probe_imports_nothing_but_the_socket_and_sys_modules() -> None:
    tree = ast.parse(Path(PROBE).read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    assert imported == {"_socket", "sys"}


def test_readyz_follows_the_servers_health_from_start_to_drain(address: str) -> None:
    async def lifecycle() -> list[int]:
        running = await start_server([], "127.0.0.1:0", ServerSettings())
        seen = [probe.status(address)]
        await running.set_health(health_pb2.HealthCheckResponse.NOT_SERVING)  # as at SIGTERM
        seen.append(probe.status(address))
        await running.stop(0)
        return seen

    assert asyncio.run(lifecycle()) == [200, 503]
