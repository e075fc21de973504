"""The peer benchmark's runs: each server started in turn, driven closed-loop, its CPU read."""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench import peers
from bench.load import LoadPool, Plan
from bench.measure import closed, point
from bench.peers import cpu, report
from bench.peers.rows import FULL, QUICK, Row, Timing
from bench.peers.servers import (
    GROUPS,
    SERVERS,
    Context,
    Target,
    Unavailable,
    await_rest,
    start,
)
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parents[1] / "results"
CLIENT = (("x-client-id", "strata-bench"),)
PIPELINE = "digits"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    timing = QUICK if args.quick else FULL
    if args.duration is not None:
        timing = replace(timing, seconds=args.duration)
    timing = replace(timing, connections=args.connections)
    started = time.monotonic()
    rows, skipped = measure_all(args.config, args.servers, timing, args.workers)
    result = report.build(rows, skipped, args.config, timing, time.monotonic() - started)
    print(report.markdown(result))
    for path in report.write(args.out, args.name, result):
        print(f"wrote {path}")
    return 0


def measure_all(
    config: Path, servers: list[str], timing: Timing, workers: int
) -> tuple[list[Row], dict[str, str]]:
    """Every chosen server, one group at a time: its rows, and why any was skipped."""
    settings = load_settings(config)
    if not has_dataset(PIPELINE):
        raise SystemExit("no digits demo data set under build/data (`make models` builds it)")
    w = workload(settings, PIPELINE)
    rows: list[Row] = []
    skipped: dict[str, str] = {}
    with LoadPool(workers) as pool, tempfile.TemporaryDirectory(prefix="strata-peers-") as tmp:
        ctx = Context(config, w, Path(tmp))
        for group, members in GROUPS.items():
            chosen = [s for s in members if s in servers]
            if not chosen:
                continue
            try:
                with start(group, ctx) as targets:
                    for target in (t for t in targets if t.server in chosen):
                        rows += _measure_ready(pool, target, timing, w.objective_seconds, skipped)
            except Unavailable as exc:
                _skip(skipped, chosen, exc)
    return rows, skipped


def _measure_ready(
    pool: LoadPool, target: Target, timing: Timing, objective: float, skipped: dict[str, str]
) -> list[Row]:
    """`target`'s rows once its REST side (if it is one) is ready; none, saying why, if not."""
    try:
        await_rest(target)
    except Unavailable as exc:
        _skip(skipped, [target.server], exc)
        return []
    return measure(pool, target, timing, objective)


def _skip(skipped: dict[str, str], servers: list[str], why: Unavailable) -> None:
    skipped.update(dict.fromkeys(servers, str(why)))
    print(f"{', '.join(servers)} skipped: {why}", flush=True)


def measure(pool: LoadPool, target: Target, timing: Timing, objective: float) -> list[Row]:
    """Closed loop at each concurrency: the figures, and CPU ms per answer of each process."""
    rows = []
    for concurrency in timing.concurrencies:
        plan = Plan(
            target=target.address,
            method=target.method,
            requests=target.requests,
            metadata=CLIENT,
            timeout=None,  # as tritonclient and perf_analyzer send by default: no deadline
            connections=target.connections(concurrency, timing.connections),
        )
        closed(pool, plan, concurrency, timing.warmup_seconds)
        processes = cpu.processes(target.roots())
        before = cpu.snapshot(processes)
        results = closed(pool, plan, concurrency, timing.seconds)
        used = cpu.spent(before, cpu.snapshot(processes))
        answered = max(int(results.ok.sum()), 1)
        row = Row(
            target.server,
            target.title,
            target.carries,
            concurrency,
            point(f"c={concurrency}", results, objective),
            {name: seconds * 1000 / answered for name, seconds in used.items()},
        )
        print(_line(row), flush=True)
        rows.append(row)
    return rows


def _line(row: Row) -> str:
    p = row.point
    return (
        f"{row.server} c={row.concurrency}: {row.full_throughput:.0f} full answers/s "
        f"({p.degraded} degraded, {sum(p.errors.values())} failed), P50 {p.p50_ms:.2f} ms, "
        f"P99 {p.p99_ms:.2f} ms, CPU {row.cpu_total_ms:.2f} ms/request"
    )


def _servers(text: str) -> list[str]:
    chosen = [s.strip() for s in text.split(",") if s.strip()]
    unknown = sorted(set(chosen) - set(SERVERS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown server(s) {unknown}; choose from {SERVERS}")
    return chosen


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a positive whole number")
    return int(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=peers.__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="smoke run: c=1 and c=8, 2 s each")
    parser.add_argument("--duration", type=float, help="seconds per measured point")
    parser.add_argument(
        "--servers",
        type=_servers,
        default=list(SERVERS),
        help=f"comma-separated subset of {','.join(SERVERS)} (default: all)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--name", default="peers", help="file stem: NAME.md, .json, .png")
    parser.add_argument("--workers", type=int, default=2, help="load tool processes")
    parser.add_argument(
        "--connections",
        type=_positive,
        default=1,
        help="gRPC connections the calls share (default 1, as tritonclient keeps)",
    )
    return parser
