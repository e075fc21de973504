"""The benchmark suite: `python -m bench.suite --config configs/default.yaml [--quick]`.

One run on one machine, every figure measured in the same run so the ratios between them hold:

1. the in-process ONNX Runtime ceiling of each pipeline's model (best batch size);
2. the system started from the config (free ports, an admin token), with the ladder pinned
   at level 0 through the admin API: the inference service alone, called directly, and the
   full pipeline through the gateway — capacity (closed loop) and latency at light load (open
   loop, the same rate for both), so the pipeline's share of the ceiling and what the hops add;
3. the ladder released, an open-loop sweep from light load to twice the pipeline's capacity:
   throughput, goodput (full answers within the pipeline's latency objective), P50/P95/P99,
   errors by code, and the highest degradation level the gateway reached (admin Status);
4. all of 2 and 3 again with tracing on: every service exporting spans over OTLP to an
   in-process receiver (strata.telemetry.traces.Receiver).

Results go to `--out` (bench/results/): suite.md, suite.json, and two plots — latency
against throughput, and the degradation level over time.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from bench import ceiling as ceilings
from bench.admin import Admin, LevelWatch
from bench.deployment import CountingReceiver, inference_address, running
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import Point, closed, opened, point
from bench.report import machine
from bench.suite_report import print_tables, write
from bench.suite_results import PipelineRun, Step, Suite, SuitePlan, SystemRun
from bench.workloads import Workload, has_dataset, workload
from strata.config import load_settings
from strata.tools.launch import Supervisor

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)

FULL = SuitePlan(0.5, 1.0, 4.0, 8.0, 25.0, 5.0, (0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0), None, 30)
QUICK = SuitePlan(0.03, 0.2, 0.6, 0.8, 20.0, 0.8, (0.5, 2.0), 1, 3)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on the way out
    started = time.monotonic()
    plan = QUICK if args.quick else FULL
    settings = load_settings(args.config)
    names = args.pipelines or [p for p in settings.pipelines if has_dataset(p)]
    if not names:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    for name in names:
        if name not in settings.pipelines or not has_dataset(name):
            raise SystemExit(
                f"pipeline {name!r} is not in {args.config} or has no demo data "
                "set under build/data (`make models` builds them)"
            )
    loads = [workload(settings, name) for name in names]
    threads = settings.inference.workers
    found = {
        w.pipeline: ceilings.measure(w.folder, w.spec, w.sample, threads, plan.ceiling_seconds)
        for w in loads
    }
    print(f"ceilings measured ({', '.join(f'{k} {c.best:,.0f} rows/s' for k, c in found.items())})")
    with LoadPool(args.workers) as pool, tempfile.TemporaryDirectory(prefix="strata-") as tmp:
        runs = [
            system_run(args.config, Path(tmp) / f"tracing-{on}", pool, loads, plan, on)
            for on in args.tracing
        ]
    suite = Suite(
        machine=machine(),
        config=str(args.config),
        mode="quick" if args.quick else "full",
        plan=plan,
        ceilings={k: dict(c.rows_per_second) for k, c in found.items()},
        runs=runs,
        seconds=time.monotonic() - started,
    )
    print_tables(suite)
    for path in write(args.out, suite):
        print(f"wrote {path}")
    return 0


def system_run(
    config: Path,
    folder: Path,
    pool: LoadPool,
    loads: list[Workload],
    plan: SuitePlan,
    tracing: bool,
) -> SystemRun:
    """Start the system (tracing on or off), measure every pipeline, stop it."""
    folder.mkdir(parents=True)
    receiver = CountingReceiver() if tracing else None
    with contextlib.ExitStack() as stack:
        endpoint = None
        if receiver is not None:
            stack.enter_context(receiver)
            endpoint = f"http://127.0.0.1:{receiver.port}"
        supervisor, token = stack.enter_context(running(config, folder, endpoint))
        admin = Admin(supervisor.address("gateway"), token)
        stack.callback(admin.close)
        watch = stack.enter_context(LevelWatch(admin))
        run = SystemRun(tracing, [], watch.samples, [], began=time.time())
        print(f"system up (tracing {'on' if tracing else 'off'})", flush=True)
        admin.force(0)
        run.pipelines = [baseline(pool, supervisor, w, plan) for w in loads]
        admin.release()
        for w, measured in list(zip(loads, run.pipelines, strict=True))[: plan.sweeps]:
            gateway = _gateway_plan(supervisor, w, plan)
            measured.sweep = sweep(pool, admin, watch, run, w, plan, gateway)
    run.spans = receiver.spans if receiver is not None else 0
    return run


def baseline(pool: LoadPool, supervisor: Supervisor, w: Workload, plan: SuitePlan) -> PipelineRun:
    """Capacity and light-load latency, of the inference service alone and of the pipeline."""
    gateway = _gateway_plan(supervisor, w, plan)
    target = inference_address(supervisor.settings, w.deployment)
    direct = replace(gateway, target=target, requests=w.model_requests)
    for warm in (direct, gateway):
        closed(pool, warm, 4, plan.warmup_seconds)
    objective = w.objective_seconds
    seconds = plan.capacity_seconds
    direct_capacity = point(
        "alone", closed(pool, direct, plan.direct_concurrency, seconds), objective
    )
    pipe_capacity = point(
        "pipeline", closed(pool, gateway, plan.pipeline_concurrency, seconds), objective
    )
    if pipe_capacity.throughput <= 0:
        raise SystemExit(f"pipeline {w.pipeline!r} answered nothing: {pipe_capacity.errors}")
    rate = max(1.0, min(plan.light_rps, 0.1 * pipe_capacity.throughput))
    light = [
        point(label, opened(pool, p, rate, plan.light_seconds), objective)
        for label, p in (("alone", direct), ("pipeline", gateway))
    ]
    print(
        f"{w.pipeline}: capacity alone {direct_capacity.throughput:.0f}/s, "
        f"pipeline {pipe_capacity.throughput:.0f}/s",
        flush=True,
    )
    return PipelineRun(
        pipeline=w.pipeline,
        model=w.model,
        version=w.version,
        deployment=w.deployment,
        objective_ms=objective * 1000,
        direct_capacity=direct_capacity,
        pipeline_capacity=pipe_capacity,
        direct_light=light[0],
        pipeline_light=light[1],
    )


def sweep(
    pool: LoadPool,
    admin: Admin,
    watch: LevelWatch,
    run: SystemRun,
    w: Workload,
    plan: SuitePlan,
    gateway: Plan,
) -> list[Point]:
    """Open loop from light load to twice the capacity, the ladder free to move."""
    capacity = next(p for p in run.pipelines if p.pipeline == w.pipeline).pipeline_capacity
    points = []
    for fraction in plan.fractions:
        if not admin.wait_calm(plan.calm_seconds):
            run.unsettled += 1
        rate = fraction * capacity.throughput
        began = time.time()
        results = opened(pool, gateway, rate, plan.sweep_seconds)
        ended = time.time()
        level = watch.highest(began, ended)
        points.append(point(f"{fraction:g}x", results, w.objective_seconds, level))
        run.steps.append(
            Step(w.pipeline, f"{fraction:g}x", rate, began - run.began, ended - run.began)
        )
        print(
            f"{w.pipeline} {fraction:g}x: {points[-1].throughput:.0f}/s, level {level}", flush=True
        )
    return points


def _gateway_plan(supervisor: Supervisor, w: Workload, plan: SuitePlan) -> Plan:
    return Plan(
        target=supervisor.address("gateway"),
        method=INFER,
        requests=w.pipeline_requests,
        metadata=CLIENT,
        timeout=plan.timeout,
        # Overload keeps hundreds of requests open; gRPC servers refuse streams beyond their
        # per-connection limit (256 here), which many real clients would never meet.
        connections=8,
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.suite", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run, well under a minute")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument(
        "--pipelines",
        type=lambda s: s.split(","),
        help="pipelines to measure, comma-separated (default: those with a demo data set)",
    )
    parser.add_argument(
        "--tracing",
        type=lambda s: [{"off": False, "on": True}[part] for part in s.split(",")],
        default=[False, True],
        help="system runs: off, on or off,on (default)",
    )
    parser.add_argument("--workers", type=int, default=2, help="load tool processes")
    return parser


if __name__ == "__main__":
    sys.exit(main())
