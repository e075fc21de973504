"""Gateway processes side by side: `python -m bench.processes [--config ...] [--counts 1,2]
[--rounds 4] [--duration 3]`.

One system from the config per `gateway.processes` count, all started at once. The same
closed-loop client measures each in turn against the first pipeline with a demo data set,
64 requests in flight from 8 connections (the kernel spreads connections over the gateway's
processes) and from one (which one process serves), in short rounds whose order alternates,
so that a noisy neighbour hits every count alike. It prints each round's throughput and the
gateway's CPU a request (all its processes), and reports each round's throughput and the
median over rounds of each count's throughput over one process's. Results go to
`--out` (bench/results/processes.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
from pathlib import Path

import psutil

from bench.deployment import running
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
IN_FLIGHT = 64
CONNECTIONS = (8, 1)
WARMUP_SECONDS = 2.0

# (round, processes, connections) -> answers per second
Figures = dict[tuple[int, int, int], float]


def measure(config: Path, counts: tuple[int, ...], rounds: int, seconds: float) -> Figures:
    """Each count's system measured in turn, `rounds` times from each number of connections."""
    settings = load_settings(config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    requests = workload(settings, name).pipeline_requests
    figures: Figures = {}
    with contextlib.ExitStack() as stack, LoadPool(2) as pool:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        targets, gateways = {}, {}
        for count in counts:
            folder = tmp / f"processes-{count}"
            folder.mkdir()
            supervisor, _ = stack.enter_context(
                running(config, folder, gateway={"processes": count})
            )
            targets[count] = supervisor.address("gateway")
            gateways[count] = psutil.Process(supervisor.processes["gateway"].pid)
        for connections in CONNECTIONS:
            plans = {
                count: Plan(
                    target=target,
                    method=INFER,
                    requests=requests,
                    metadata=CLIENT,
                    timeout=30,
                    connections=connections,
                )
                for count, target in targets.items()
            }
            for plan in plans.values():
                closed(pool, plan, IN_FLIGHT, WARMUP_SECONDS)
            for round_ in range(1, rounds + 1):
                order = list(plans) if round_ % 2 else list(plans)[::-1]
                for count in order:
                    before = cpu_seconds(gateways[count])
                    results = closed(pool, plans[count], IN_FLIGHT, seconds)
                    cpu = (cpu_seconds(gateways[count]) - before) / max(1, results.count)
                    errors = dict(results.error_counts()) or 0
                    figures[(round_, count, connections)] = results.throughput()
                    print(
                        f"round {round_}, processes {count}, {connections} connections: "
                        f"{results.throughput():.0f}/s, gateway CPU {cpu * 1000:.3f} ms a "
                        f"request, {errors} errors",
                        flush=True,
                    )
    return figures


def cpu_seconds(gateway: psutil.Process) -> float:
    """CPU the gateway's processes (the parent and its workers, if any) have used so far."""
    return sum(sum(p.cpu_times()[:2]) for p in [gateway, *gateway.children()])


def report(figures: Figures) -> str:
    """Per connection count: each count's throughput by round and its median ratio to 1."""
    rounds = sorted({r for r, _, _ in figures})
    counts = sorted({p for _, p, _ in figures})
    lines = [
        f"{IN_FLIGHT} requests in flight, closed loop; throughput per round (answers/s) and "
        "the median over rounds of each round's ratio to one process.",
        "",
        "| connections | processes | per round | median ratio to 1 process |",
        "|---:|---:|---|---:|",
    ]
    for connections in CONNECTIONS:
        for count in counts:
            values = [figures[(r, count, connections)] for r in rounds]
            ratios = [v / figures[(r, 1, connections)] for r, v in zip(rounds, values, strict=True)]
            shown = ", ".join(f"{v:.0f}" for v in values)
            lines.append(f"| {connections} | {count} | {shown} | {statistics.median(ratios):.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.processes", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument(
        "--counts",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        default=(1, 2),
        help="gateway.processes values to compare, comma-separated (1 is always measured)",
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds, order alternating")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds a point")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 s")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.duration)
    counts = tuple(sorted({1, *args.counts}))
    table = report(measure(args.config, counts, rounds, seconds))
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "processes.md").write_text(f"# Gateway processes side by side\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
