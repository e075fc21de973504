"""The image's entry commands start, pass their health checks, and stop cleanly.

The commands and health checks come from deploy/docker-compose.yml (the Kubernetes manifests
run the same commands: test_deploy_k8s holds them equal), the config from configs/compose.yaml
with every address moved to a free loopback port. They run as local processes from the
repository root, which is what the image's /app holds, so a command that cannot start, a
config the services reject, or a health check that never passes fails here before any image
is built. Also the health-check command itself, against an in-process server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
import yaml
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from scripts.make_certs import ADMIN_FILE, ADMIN_SECRET, KEYS_FILE, KEYS_SECRET, make_certs
from strata.tools import healthcheck
from tests.support.system import free_port
from tests.unit.deploy.test_deploy import (
    COMPOSE_CONFIG,
    ROOT,
    container_settings,
    endpoints,
    env_of,
    load_compose,
    port_of,
    strata_services,
)

START_SECONDS = 60.0


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer]]:
    server = grpc.server(ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(None)


def test_healthcheck_passes_only_when_serving(
    health_server: tuple[str, health.HealthServicer], capsys: pytest.CaptureFixture[str]
) -> None:
    address, servicer = health_server
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    assert healthcheck.main([address]) == 0
    assert "SERVING" in capsys.readouterr().out
    servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
    assert healthcheck.main([address]) == 1
    assert "NOT_SERVING" in capsys.readouterr().err


def test_healthcheck_fails_for_an_unknown_service_or_no_server(
    health_server: tuple[str, health.HealthServicer], capsys: pytest.CaptureFixture[str]
) -> None:
    address, _ = health_server
    assert healthcheck.main([address, "--service", "no.such.Service"]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err
    assert healthcheck.main([f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 1
    assert "UNAVAILABLE" in capsys.readouterr().err


def loopback_config(folder: Path) -> tuple[Path, dict[int, int]]:
    """configs/compose.yaml with every port moved to a free loopback one, and the port map;
    its mutual TLS on with certificates and secrets made for the test, as `make certs` does."""
    raw = yaml.safe_load(COMPOSE_CONFIG.read_text())
    moved: dict[int, int] = {}

    def move(address: str) -> str:
        port = free_port()
        while port in moved.values():
            port = free_port()
        moved[port_of(address)] = port
        return f"127.0.0.1:{port}"

    services = raw["services"]
    inference = services["inference"].values()
    for spec in [services["gateway"], services["preprocess"], services["postprocess"], *inference]:
        spec["listen"] = move(spec["listen"])
        spec["metrics"] = move(spec["metrics"])
        spec.pop("target", None)  # callers dial the listen address
    services["gateway"]["admin_listen"] = move(services["gateway"]["admin_listen"])
    raw["repository"] = str((COMPOSE_CONFIG.parent / raw["repository"]).resolve())
    certs = folder / "certs"
    make_certs(certs)
    raw["tls"]["certs"] = str(certs)
    raw["gateway"]["api_keys_file"] = str(certs / KEYS_SECRET / KEYS_FILE)
    raw["gateway"]["admin_token_file"] = str(certs / ADMIN_SECRET / ADMIN_FILE)
    raw["server"]["grace_seconds"] = 1
    path = folder / COMPOSE_CONFIG.name
    path.write_text(yaml.safe_dump(raw))
    return path, moved


def relocate(argv: list[str], config: Path, moved: dict[int, int]) -> list[str]:
    """A container command as a local one: this interpreter, the test config, loopback ports."""
    out = [sys.executable if argv[0] == "python" else argv[0]]
    for arg in argv[1:]:
        if arg.startswith("configs/"):
            arg = str(config)
        elif ":" in arg and arg.rpartition(":")[2].isdigit():
            arg = f"127.0.0.1:{moved[port_of(arg)]}"
        out.append(arg)
    return out


def wait_healthy(name: str, check: list[str], process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"{name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        if subprocess.run(check, cwd=ROOT, capture_output=True, check=False).returncode == 0:
            return
        time.sleep(0.2)
    pytest.fail(f"{name} never passed its health check:\n{log.read_text()[-3000:]}")


def test_compose_entry_commands_start_serve_and_stop(tmp_path: Path) -> None:
    config, moved = loopback_config(tmp_path)
    services = strata_services(load_compose())
    processes: dict[str, subprocess.Popen] = {}
    try:
        for name, service in services.items():
            env = {**os.environ, **env_of(service), "PYTHONUNBUFFERED": "1"}
            env.pop("OTEL_EXPORTER_OTLP_ENDPOINT")  # no collector here
            with open(tmp_path / f"{name}.log", "wb") as log:
                processes[name] = subprocess.Popen(
                    relocate(service["command"], config, moved),
                    cwd=ROOT,
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        for name, service in services.items():
            check = relocate(service["healthcheck"]["test"][1:], config, moved)
            wait_healthy(name, check, processes[name], tmp_path / f"{name}.log")
            metrics = moved[endpoints(container_settings())[name].metrics_port]
            page = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5)
            assert b"process_cpu_seconds_total" in page.read(), name
        codes = {}
        for name in ["gateway", *(n for n in services if n != "gateway")]:
            processes[name].send_signal(signal.SIGTERM)
            codes[name] = processes[name].wait(timeout=15)
        assert codes == dict.fromkeys(codes, 0), codes
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
