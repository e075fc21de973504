"""Real service processes on free loopback ports, for service and end-to-end tests."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from strata.config import load_settings
from strata.tools.launch import Supervisor, start_on_fresh_ports

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
CLIENTS = ROOT / "tests" / "e2e" / "clients"


def bindable(ports: range) -> bool:
    """Whether each of `ports` can be bound on loopback now."""
    sockets = []
    try:
        for port in ports:
            sock = socket.socket()
            sockets.append(sock)
            sock.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()


class PortSlice:
    """Blocks of consecutive ports from `size` ports at `first`, handed out in turn from
    `start`, wrapping round to `first`: a port comes round again only after every other port
    of the slice has, and only if nothing holds it then."""

    def __init__(
        self, first: int, size: int, start: int = 0, free: Callable[[range], bool] = bindable
    ) -> None:
        self.first, self.size, self._at, self._free = first, size, start, free
        self._lock = threading.Lock()

    def take(self, count: int = 1) -> int:
        """The first of `count` consecutive ports that are free now."""
        with self._lock:
            for _ in range(self.size):
                if self._at + count > self.size:  # a block never straddles the wrap
                    self._at = 0
                base = self.first + self._at
                self._at += count
                if self._free(range(base, base + count)):
                    return base
        raise RuntimeError(f"no {count} free ports in a row in {self.first}+{self.size}")


# Ports are drawn below the kernel's ephemeral range (32768 and up by default), so no client
# connection's local port can take one between its choice and the service's bind, and each
# pytest-xdist worker draws from its own slice, so two workers never choose the same one. A
# process starts at a random place in its slice: suites run side by side (several checkouts
# on one machine) would otherwise count up from the slice's start in step, choosing the same
# ports at the same moments, and lose starts to each other.
_SLICE = 2000
_FIRST = 12000 + _SLICE * int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
_PORTS = PortSlice(_FIRST, _SLICE, random.randrange(_SLICE))


def free_port(count: int = 1) -> int:
    """The first of `count` consecutive loopback ports that are free now, from this worker's
    slice."""
    return _PORTS.take(count)


def endpoint(replicas: int = 1) -> dict[str, Any]:
    """A config endpoint on free loopback ports."""
    return {"listen": f"127.0.0.1:{free_port(replicas)}", "replicas": replicas}


def merge(base: dict, changes: dict) -> dict:
    """Deep-merge `changes` into a copy of `base` (mappings merge, other values replace)."""
    out = dict(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def make_config(folder: Path, changes: dict[str, Any] | None = None) -> Path:
    """The default config on free ports, with `changes` merged in, written into `folder`."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["repository"] = str((DEFAULT_CONFIG.parent / raw["repository"]).resolve())
    services = raw["services"]
    raw["services"] = {
        "gateway": {**endpoint(), "rest": f"127.0.0.1:{free_port()}"},
        "preprocess": endpoint(services["preprocess"].get("replicas", 1)),
        "postprocess": endpoint(),
        "inference": {name: endpoint() for name in services["inference"]},
    }
    raw["server"]["grace_seconds"] = 2
    path = folder / "strata.yaml"
    path.write_text(yaml.safe_dump(merge(raw, changes or {})))
    return path


@contextmanager
def running_system(
    folder: Path,
    changes: dict[str, Any] | Callable[[], dict[str, Any]] | None = None,
    env: dict[str, str] | None = None,
    launcher: type[Supervisor] = Supervisor,
) -> Iterator[Supervisor]:
    """All four services as processes, started by `launcher`; stopped (SIGTERM) when the
    block ends.

    The ports are chosen free, then bound by the services a moment later: another process
    (this machine runs many suites) may take one in between. A start that fails for a port
    in use is tried again on new ports (`changes`, where it is a function, is asked again:
    its ports are new too); any other failure is the test's."""

    def build() -> Supervisor:
        config = make_config(folder, changes() if callable(changes) else changes)
        return launcher(config, load_settings(config), log_dir=folder, env=env)

    supervisor = start_on_fresh_ports(build)
    try:
        yield supervisor
    finally:
        supervisor.stop_all()


def run_client(script: str, *args: str, timeout: float = 120) -> Any:
    """Run tests/e2e/clients/<script>.py in its own interpreter and parse its JSON output.

    tritonclient registers the same protobuf names as our stubs, so it never shares a
    process with them.
    """
    done = subprocess.run(
        [sys.executable, str(CLIENTS / f"{script}.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"{script} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)
