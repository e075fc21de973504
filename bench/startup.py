"""Start to ready: `python -m bench.startup [--config configs/default.yaml] [--runs 1]`.

Each run starts the launcher as `make run` does (strata/ and services/ byte-compiled, then
`python -m strata.tools.launch`), on the config moved to free loopback ports (every service's
metrics page too), and waits until every process's `/readyz` answers 200. It prints one
JSON line: the seconds from the launcher's start to the last ready, and each process's CPU
seconds (user + system), PSS and USS (MB) at that moment (the launcher's, the zygote's its
services are forked from, and each service's), with their sums; then it stops
the launcher (SIGTERM stops every service). With several runs it prints the medians last.
Start-up is mostly CPU, so on a busy machine the CPU seconds vary less than the wall time:
quote medians, beside the load average. PSS splits a library's pages among every process
that maps them, other programs' too, so it reads lower while others run the same
libraries; USS, what each process holds alone, does not.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import yaml

from bench.deployment import free_port
from strata.config import load_settings
from strata.tools.probe import status

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_SECONDS = 120.0
POLL_SECONDS = 0.02


def config_on_free_ports(config: Path, folder: Path) -> Path:
    """`config` with every service, its metrics page and the gateway's REST on free ports."""
    settings = load_settings(config)
    raw = yaml.safe_load(config.read_text())
    raw["repository"] = str(settings.repository)

    def endpoint(replicas: int) -> dict[str, Any]:
        return {
            "listen": f"127.0.0.1:{free_port(replicas)}",
            "metrics": f"127.0.0.1:{free_port(replicas)}",
            "replicas": replicas,
        }

    services = settings.services
    raw["services"] = {
        "gateway": {**endpoint(1), "rest": f"127.0.0.1:{free_port()}"},
        "preprocess": endpoint(services.preprocess.replicas),
        "postprocess": endpoint(services.postprocess.replicas),
        "inference": {name: endpoint(e.replicas) for name, e in services.inference.items()},
    }
    path = folder / "startup.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path


def probes(config: Path) -> list[str]:
    """Every process's metrics address, where its /readyz answers."""
    services = load_settings(config).services
    endpoints = [services.gateway, services.preprocess, services.postprocess]
    endpoints += services.inference.values()
    return [str(e.metrics_for(listen)) for e in endpoints for listen in e.listens]


def ready(address: str) -> bool:
    try:
        return status(address, timeout=1.0) == 200
    except OSError:
        return False


def run_once(config: Path) -> dict[str, Any]:
    """One start of the launcher on `config`: seconds to ready, and each process's CPU and PSS."""
    waiting = probes(config)
    command = [sys.executable, "-m", "strata.tools.launch", "--config", str(config)]
    started = time.monotonic()
    launcher = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        while waiting:
            if launcher.poll() is not None:
                raise SystemExit(f"the launcher exited with {launcher.returncode} while starting")
            if time.monotonic() - started > TIMEOUT_SECONDS:
                raise SystemExit(f"not ready after {TIMEOUT_SECONDS:.0f} s: {waiting}")
            waiting = [address for address in waiting if not ready(address)]
            time.sleep(POLL_SECONDS if waiting else 0)
        seconds = time.monotonic() - started
        processes = _footprint(psutil.Process(launcher.pid))
    finally:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait(timeout=60)
    return {
        "ready_s": round(seconds, 3),
        "cpu_s": round(sum(p["cpu_s"] for p in processes.values()), 2),
        "pss_mb": round(sum(p["pss_mb"] for p in processes.values()), 1),
        "uss_mb": round(sum(p["uss_mb"] for p in processes.values()), 1),
        "processes": processes,
    }


def _footprint(launcher: psutil.Process) -> dict[str, dict[str, float]]:
    """The launcher's, its zygote's and each service's CPU seconds, PSS and USS (MB), by name
    and port."""
    out = {}
    for process in [launcher, *launcher.children(recursive=True)]:
        name = _name(process)
        if name in out:  # a gateway's workers run their parent's command line
            name += f"#{process.pid}"
        cpu, memory = process.cpu_times(), process.memory_full_info()
        out[name] = {
            "cpu_s": round(cpu.user + cpu.system, 2),
            "pss_mb": round(memory.pss / 2**20, 1),
            "uss_mb": round(memory.uss / 2**20, 1),
        }
    return out


def _name(process: psutil.Process) -> str:
    """`strata.tools.launch`, `strata.process.zygote`, `inference:PORT`..., or a forked
    service's own name (the zygote's command line is all its forks have: strata.process.zygote
    names each after its instance, `inference-a`)."""
    args = process.cmdline()
    name = args[args.index("-m") + 1].removeprefix("services.")
    if "--listen" in args:
        return name + ":" + args[args.index("--listen") + 1].rpartition(":")[2]
    own = process.name()
    return name if own.startswith("python") else own


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--runs", type=int, default=1, help="starts, one after another")
    args = parser.parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    for package in ("strata", "services"):
        compileall.compile_dir(ROOT / package, quiet=1)
    runs = []
    with tempfile.TemporaryDirectory(prefix="strata-startup-") as folder:
        for _ in range(args.runs):
            config = config_on_free_ports(args.config.resolve(), Path(folder))
            runs.append(run_once(config))
            print(json.dumps(runs[-1]), flush=True)
    if args.runs > 1:
        medians = {
            k: statistics.median(r[k] for r in runs)
            for k in ("ready_s", "cpu_s", "pss_mb", "uss_mb")
        }
        print(json.dumps({"median": medians, "load_average": os.getloadavg()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
