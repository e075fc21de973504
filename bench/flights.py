"""Flights: `python -m bench.flights --config configs/default.yaml [--quick]`.

Under load the gateway carries concurrent requests through the chain together, in flights
(`gateway.flights`: `max_in_air` flights at once, each of at most `max_requests` requests and
`max_rows` rows). This measures what that buys, in one run: the system twice, side by side on
free ports — as configured, and with flights off (every request its own flight,
`gateway.flights.max_in_air` beyond any concurrency) — both with the ladder pinned at level 0
so that only the flights differ. For each pipeline, in rounds that alternate between the two
so a noisy neighbour hits both alike: capacity (closed loop, many requests in flight) and
latency at light load (open loop, the same rate for both). Results go to `--out` as
flights.md and flights.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from bench.admin import Admin
from bench.deployment import running
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import Point, closed, opened, point
from bench.report import machine
from bench.suite_report import clean
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
OFF = {"flights": {"max_in_air": 1_000_000}}  # every request its own flight


@dataclass(frozen=True)
class Timing:
    rounds: int
    warmup_seconds: float
    capacity_seconds: float
    light_seconds: float
    light_rps: float
    concurrency: int


FULL = Timing(3, 1.0, 6.0, 5.0, 20.0, 64)
QUICK = Timing(1, 0.2, 0.8, 0.8, 20.0, 16)


@dataclass
class Side:
    """One system's measurements of one pipeline, every round."""

    capacity: list[Point] = field(default_factory=list)
    light: list[Point] = field(default_factory=list)

    def best(self) -> Point:
        return max(self.capacity, key=lambda p: p.throughput)

    def lightest(self) -> Point:
        return min(self.light, key=lambda p: p.p50_ms)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    timing = QUICK if args.quick else FULL
    settings = load_settings(args.config)
    names = [p for p in settings.pipelines if has_dataset(p)]
    if not names:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    loads = [workload(settings, name) for name in names]
    measured: dict[str, dict[str, Side]] = {
        w.pipeline: {"on": Side(), "off": Side()} for w in loads
    }
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(LoadPool(args.workers))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        gateways = {}
        for side, changes in (("on", None), ("off", OFF)):
            folder = tmp / side
            folder.mkdir()
            supervisor, token = stack.enter_context(running(args.config, folder, None, changes))
            admin = Admin(supervisor.address("gateway"), token)
            stack.callback(admin.close)
            admin.force(0)
            gateways[side] = supervisor.address("gateway")
        print("both systems up (flights on and off)", flush=True)
        for round_ in range(timing.rounds):
            for w in loads:
                order = ("on", "off") if round_ % 2 == 0 else ("off", "on")
                for side in order:
                    plan = _plan(gateways[side], w.pipeline_requests)
                    _measure(pool, plan, timing, w.objective_seconds, measured[w.pipeline][side])
                print(_line(w.pipeline, measured[w.pipeline]), flush=True)
    report = _report(args.config, measured, timing)
    print(_markdown(report))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "flights.md").write_text(_markdown(report))
    (args.out / "flights.json").write_text(json.dumps(clean(report), indent=2))
    print(f"wrote {args.out / 'flights.md'}\nwrote {args.out / 'flights.json'}")
    return 0


def _plan(target: str, requests: tuple[bytes, ...]) -> Plan:
    return Plan(
        target=target, method=INFER, requests=requests, metadata=CLIENT, timeout=30, connections=8
    )


def _measure(pool: LoadPool, plan: Plan, t: Timing, objective: float, side: Side) -> None:
    closed(pool, plan, 4, t.warmup_seconds)
    side.capacity.append(
        point("capacity", closed(pool, plan, t.concurrency, t.capacity_seconds), objective)
    )
    side.light.append(point("light", opened(pool, plan, t.light_rps, t.light_seconds), objective))


def _line(pipeline: str, sides: dict[str, Side]) -> str:
    on, off = sides["on"].capacity[-1], sides["off"].capacity[-1]
    return f"{pipeline}: flights on {on.throughput:.0f}/s, off {off.throughput:.0f}/s"


def _report(config: Path, measured: dict[str, dict[str, Side]], timing: Timing) -> dict:
    pipelines = {}
    for name, sides in measured.items():
        on, off = sides["on"], sides["off"]
        pipelines[name] = {
            "capacity_on": on.best().as_dict(),
            "capacity_off": off.best().as_dict(),
            "capacity_ratio": on.best().throughput / max(off.best().throughput, 1e-9),
            "light_on": on.lightest().as_dict(),
            "light_off": off.lightest().as_dict(),
            "rounds": {
                side: [p.throughput for p in s.capacity] for side, s in (("on", on), ("off", off))
            },
        }
    return {
        "machine": machine(),
        "config": str(config),
        "timing": timing.__dict__,
        "pipelines": pipelines,
    }


def _markdown(report: dict) -> str:
    timing = report["timing"]
    lines = [
        "# Flights: requests carried through the chain together",
        "",
        f"Machine: {report['machine']}. Config: `{report['config']}`, ladder pinned at level 0; "
        f"best of {timing['rounds']} alternating rounds; capacity with "
        f"{timing['concurrency']} requests in flight, light load at {timing['light_rps']:g}/s.",
        "",
        "| pipeline | capacity on /s | capacity off /s | on / off | P99 at capacity on / off ms "
        "| light P50 on / off ms | light P99 on / off ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, p in report["pipelines"].items():
        con, coff, lon, loff = p["capacity_on"], p["capacity_off"], p["light_on"], p["light_off"]
        lines.append(
            f"| {name} | {con['throughput']:,.0f} | {coff['throughput']:,.0f} "
            f"| {p['capacity_ratio']:.2f} | {con['p99_ms']:.1f} / {coff['p99_ms']:.1f} "
            f"| {lon['p50_ms']:.1f} / {loff['p50_ms']:.1f} "
            f"| {lon['p99_ms']:.1f} / {loff['p99_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.flights", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--workers", type=int, default=2, help="load tool processes")
    return parser


if __name__ == "__main__":
    sys.exit(main())
