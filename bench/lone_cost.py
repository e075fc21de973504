"""CPU per lone photo, by process: `python -m bench.lone_cost [--calls 300] [--rounds 3]`.

The images system of bench.image_chain, sent one photo at a time (one call in flight, a
plain synchronous client); each process's CPU time is read over the calls and over as long
an idle spell after them, so that what a process spends each second whatever it serves
(timers, health, metrics) is taken off what it spends per call. CPU time is each thread's
time on a CPU from /proc/<pid>/task/<tid>/schedstat (nanoseconds, where /proc's stat counts
ticks of 10 ms), summed over the process's threads; `--threads` shows each thread's share
too (the event loop's is the process's own id). Rounds alternate calls and idle; each reports
CPU ms per call, the idle rate taken off. Settings under test go in as STRATA_ variables.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import grpc

from bench.deployment import running, service_pids
from bench.image_chain import image_config, photo_requests
from bench.load.worker import INFER
from strata.tools.launch import ROOT

PROC = Path("/proc")
RESULTS = Path(__file__).resolve().parent / "results"
Threads = dict[tuple[str, int], float]  # (process, thread id) -> CPU seconds so far


def thread_seconds(named: Mapping[str, int]) -> Threads:
    """Every thread's CPU seconds so far, by (process name, thread id)."""
    found: Threads = {}
    for name, pid in named.items():
        for task in (PROC / str(pid) / "task").glob("*"):
            try:
                found[(name, int(task.name))] = (
                    int((task / "schedstat").read_text().split()[0]) / 1e9
                )
            except (OSError, ValueError):
                continue  # gone meanwhile
    return found


def _calls(stub: grpc.UnaryUnaryMultiCallable, requests: tuple[bytes, ...], n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        stub(requests[i % len(requests)], metadata=(("x-client-id", "strata-bench"),))
    return time.perf_counter() - start


def _label(key: tuple[str, int], pids: Mapping[str, int], by_thread: bool) -> str:
    name, tid = key
    if not by_thread:
        return name
    return f"{name} {'loop' if tid == pids[name] else tid}"


def measure(config: Path, calls: int, rounds: int, by_thread: bool) -> dict[str, list[float]]:
    """CPU ms per call by process (or thread), one figure a round, the idle rate taken off."""
    requests = photo_requests()
    per_call: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="strata-") as tmp:
        config, run = image_config(config, Path(tmp), 10_000.0), Path(tmp) / "run"
        run.mkdir()
        with running(config, run) as (supervisor, _):
            pids = service_pids(supervisor)
            channel = grpc.insecure_channel(supervisor.address("gateway"))
            stub = channel.unary_unary(INFER)
            _calls(stub, requests, 100)  # warm
            for _ in range(rounds):
                before = thread_seconds(pids)
                wall = _calls(stub, requests, calls)
                middle = thread_seconds(pids)
                time.sleep(wall)
                after = thread_seconds(pids)
                figures: dict[str, float] = {}
                for key, seconds in middle.items():
                    busy = seconds - before.get(key, seconds)
                    idle = after.get(key, seconds) - seconds
                    label = _label(key, pids, by_thread)
                    figures[label] = figures.get(label, 0.0) + (busy - idle) * 1000 / calls
                figures["wall per call"] = wall * 1000 / calls
                for label, ms in figures.items():
                    per_call.setdefault(label, []).append(ms)
            channel.close()
    return per_call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.lone_cost", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", action="store_true", help="each thread's share too")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20 calls, 1 round")
    args = parser.parse_args(argv)
    calls, rounds = (20, 1) if args.quick else (args.calls, args.rounds)
    table = _table(measure(args.config, calls, rounds, args.threads))
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lone_cost.md").write_text(f"# CPU ms per lone photo\n\n{table}\n")
    return 0


def _table(per_call: dict[str, list[float]]) -> str:
    """A row per process (or thread) that spent any: the median round and every round."""
    lines = ["| process | median ms | rounds |", "|---|---:|---|"]
    for name, figures in sorted(per_call.items()):
        if max(abs(f) for f in figures) >= 0.01:
            spread = " ".join(f"{f:.3f}" for f in figures)
            lines.append(f"| {name} | {statistics.median(figures):.3f} | {spread} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
