"""The gateway's own CPU per answer against a bare grpc.aio server's per call:
`python -m bench.gateway_cost [--config configs/default.yaml] [--pipeline digits]
[--other TREE ...] [--rounds 3] [--seconds 10] [--in-flight 16]`.

One system from the config, and beside its gateway the gateways of other checkouts (`--other`,
e.g. main's, to set a change against what it replaces), each named after its folder: all in
front of the same preprocess, inference and postprocess processes, so only their code differs.
For the digits pipeline bench.bare serves the digits model too: grpc.aio, decode, a tiny
model, encode, nothing else. One closed-loop client, 16 in flight (`--in-flight`) on one
connection, measures
each server in turn, in rounds whose order alternates, so that a neighbour's load hits every
server alike. The figure is CPU time (user + system, read from /proc) over answers, not
wall-clock time; each line gives the load average it ran under, and the end the medians.
Each gateway's ladder is pinned at level 0, so that every answer is the full pipeline's (a
cached or default answer would cost a fraction); the door's concurrency limit may still
refuse some requests under a neighbour's load, and each line counts them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import yaml

from bench.admin import Admin
from bench.deployment import free_port, running
from bench.load import LoadPool, Plan
from bench.load.data import from_arrays
from bench.load.worker import INFER
from bench.measure import closed
from bench.peers.cpu import cpu_seconds
from bench.text import sentences
from bench.workloads import workload
from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc

IN_FLIGHT = 16
WARMUP_SECONDS = 2.0
START_SECONDS = 60.0


def requests(config: Path, pipeline: str) -> tuple[bytes, ...]:
    """Rows of the pipeline's demo data set, or for a text pipeline one sentence each."""
    settings = load_settings(config)
    inputs = settings.pipelines[pipeline].inputs
    if inputs[0].datatype == "BYTES":
        text = np.array([s.encode() for s in sentences(0, 64)], dtype=object)
        route = settings.routes(pipeline)[0]
        return tuple(from_arrays(pipeline, {inputs[0].name: text}, 1, {"strata.arm": route.arm}))
    return workload(settings, pipeline).pipeline_requests


def ready(address: str) -> bool:
    """Whether a v2 server at `address` says ready within START_SECONDS."""
    end = time.monotonic() + START_SECONDS
    with grpc.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        while time.monotonic() < end:
            with contextlib.suppress(grpc.RpcError):
                if stub.ServerReady(v2.ServerReadyRequest(), timeout=1).ready:
                    return True
            time.sleep(0.2)
    return False


@contextlib.contextmanager
def process(command: list[str], cwd: Path, log: Path, address: str) -> Iterator[int]:
    """A plaintext server process from `cwd`'s code, once it serves at `address`: its pid."""
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    with log.open("ab") as output:
        child = subprocess.Popen(command, cwd=cwd, stdout=output, stderr=output, env=env)
    try:
        if not ready(address):
            raise SystemExit(f"{command} did not serve at {address}; see {log}")
        yield child.pid
    finally:
        child.terminate()
        child.wait(timeout=15)


def other_gateway(config: Path, tree: Path, folder: Path) -> tuple[list[str], str]:
    """The command that runs `tree`'s gateway on the system's config, on ports of its own
    (`folder`: where its config goes)."""
    raw = yaml.safe_load(config.read_text())
    listen = f"127.0.0.1:{free_port()}"
    raw["services"]["gateway"].update(listen=listen, rest=f"127.0.0.1:{free_port()}")
    for key in ("metrics", "admin_listen"):
        raw["services"]["gateway"].pop(key, None)
    path = folder / f"{tree.name}.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    command = [sys.executable, "-m", "services.gateway", "--config", str(path), "--listen", listen]
    return command, listen


def pin_level(address: str, token: str) -> None:
    admin = Admin(address, token)
    try:
        admin.force(0)
    finally:
        admin.close()


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    """Each server's CPU ms per answer, one figure a round."""
    pipeline_requests = requests(args.config, args.pipeline)
    figures: dict[str, list[float]] = {}
    with contextlib.ExitStack() as stack, LoadPool(1) as pool:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        supervisor, token = stack.enter_context(running(args.config, folder))
        servers = {"gateway": (supervisor.address("gateway"), pipeline_requests)}
        pids = {"gateway": supervisor.processes["gateway"].pid}
        for tree in args.other:
            command, address = other_gateway(supervisor.config, tree, folder)
            log = folder / f"{tree.name}.log"
            pids[tree.name] = stack.enter_context(process(command, tree, log, address))
            servers[tree.name] = (address, pipeline_requests)
        if args.pipeline == "digits":
            model = workload(supervisor.settings, "digits")
            address = f"127.0.0.1:{free_port()}"
            onnx = model.folder / "model.onnx"
            command = [sys.executable, "-m", "bench.bare", "--model", str(onnx)]
            command += ["--name", model.model, "--listen", address]
            root = Path(__file__).resolve().parent.parent
            pids["bare"] = stack.enter_context(process(command, root, folder / "bare.log", address))
            servers["bare"] = (address, model.model_requests)
        plans = {
            name: Plan(target=target, method=INFER, requests=sent, timeout=30)
            for name, (target, sent) in servers.items()
        }
        for name, (address, _) in servers.items():
            if name != "bare":  # the full pipeline every time, never a shortcut of the ladder's
                pin_level(address, token)
        print(f"process ids (for py-spy): {pids}", flush=True)
        for plan in plans.values():
            closed(pool, plan, args.in_flight, WARMUP_SECONDS)
        for round_ in range(args.rounds):
            order = list(plans) if round_ % 2 == 0 else list(plans)[::-1]
            for name in order:
                load = os.getloadavg()[0]
                before = cpu_seconds(pids[name]) or 0.0
                results = closed(pool, plans[name], args.in_flight, args.seconds)
                answers = results.codes().get("OK", 0)
                spent = (cpu_seconds(pids[name]) or 0.0) - before
                ms = spent * 1000 / max(1, answers)
                figures.setdefault(name, []).append(ms)
                print(
                    f"round {round_ + 1} {name:10} {answers / results.total_seconds:7.0f}/s "
                    f"{ms:.3f} ms CPU an answer, errors {dict(results.error_counts()) or 0}, "
                    f"load {load:.2f}",
                    flush=True,
                )
                time.sleep(0.5)
        for name in pids:  # a level that moved shed or degraded some requests: say why
            log = folder / f"{name}.log"
            for line in (log.read_text() if log.exists() else "").splitlines():
                if "degradation level" in line:
                    print(f"{name}: {line[-160:]}")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gateway_cost", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--pipeline", default="digits")
    parser.add_argument(
        "--other", type=Path, action="append", default=[], help="a checkout whose gateway to add"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--in-flight", type=int, default=IN_FLIGHT)
    args = parser.parse_args(argv)
    figures = measure(args)
    for name, values in figures.items():
        shown = ", ".join(f"{v:.3f}" for v in values)
        print(f"{name:10} median {statistics.median(values):.3f} ms CPU an answer ({shown})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
