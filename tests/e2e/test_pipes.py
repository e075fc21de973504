"""Pipes between the layers of one host (strata.rpc.pipes): the gateway's lanes to every layer
go over each layer's Unix socket, answers are the same, and the sockets go with their
processes; with pipes off, or a socket that is not there, the lanes go over gRPC."""

from __future__ import annotations

import contextlib
import os
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from strata.rpc.pipes import pipe_folder
from tests.e2e.test_lifecycle import infer_digits
from tests.support.system import free_port, running_system

HOPS = ("preprocess", "inference-a", "postprocess")


@contextlib.contextmanager
def short_root() -> Iterator[Path]:
    """A pipes root short enough for a socket's path (108 bytes at most), which pytest's
    own temporary folders under a parallel run are not."""
    with tempfile.TemporaryDirectory(prefix="pipes", dir="/tmp") as root:
        yield Path(root)


def changes(root: Path, enabled: bool = True) -> dict[str, Any]:
    return {
        "services": {"gateway": {"metrics": f"127.0.0.1:{free_port()}"}},
        "server": {"pipes": {"enabled": enabled, "root": str(root)}},
    }


def lanes_opened(metrics: str) -> dict[tuple[str, str], float]:
    """strata_gateway_lanes_opened_total by (hop, transport)."""
    with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as page:
        text = page.read().decode()
    opened = {}
    for line in text.splitlines():
        if line.startswith("strata_gateway_lanes_opened_total{"):
            labels, _, value = line.partition("} ")
            pairs = dict(part.split("=", 1) for part in labels.split("{", 1)[1].split(","))
            opened[(pairs["hop"].strip('"'), pairs["transport"].strip('"'))] = float(value)
    return opened


def answer(address: str, times: int = 30) -> None:
    for _ in range(times):  # the first calls go unary while the lanes open
        infer_digits(address)


def test_lanes_to_every_layer_of_the_host_go_over_its_pipe(tmp_path: Path) -> None:
    with short_root() as root:
        folder = pipe_folder(root)
        with running_system(tmp_path, changes(root)) as system:
            answer(system.address("gateway"))
            opened = lanes_opened(system.settings.services.gateway.metrics)
            sockets = sorted(path.name for path in folder.iterdir())
            mode = folder.stat().st_mode & 0o777
        left = list(folder.iterdir())  # each process took its socket with it
    for hop in HOPS:
        assert opened.get((hop, "pipe"), 0) >= 1, opened
        assert (hop, "grpc") not in opened, opened
    # one socket a layer's process: two preprocess replicas, two deployments, postprocess
    assert len(sockets) == 5 and all(name.endswith(".sock") for name in sockets)
    assert mode == 0o700
    assert left == []


def test_with_pipes_off_the_lanes_go_over_grpc(tmp_path: Path) -> None:
    with short_root() as root, running_system(tmp_path, changes(root, enabled=False)) as system:
        answer(system.address("gateway"))
        opened = lanes_opened(system.settings.services.gateway.metrics)
        assert not pipe_folder(root).exists()
    for hop in HOPS:
        assert opened.get((hop, "grpc"), 0) >= 1, opened
        assert (hop, "pipe") not in opened, opened


def test_a_pipe_gone_from_a_running_layer_leaves_its_lanes_on_grpc(tmp_path: Path) -> None:
    """A socket removed under a running layer (a cleaner, an operator): the lanes that open
    afterwards find no pipe and go over gRPC; no call fails."""
    with short_root() as root, running_system(tmp_path, changes(root)) as system:
        folder = pipe_folder(root)
        for path in folder.iterdir():
            os.unlink(path)
        answer(system.address("gateway"))
        opened = lanes_opened(system.settings.services.gateway.metrics)
    for hop in HOPS:
        assert opened.get((hop, "grpc"), 0) >= 1, opened
