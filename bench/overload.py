"""Overload: `python -m bench.overload --config configs/default.yaml [--quick]`.

The system from the config on free ports, the ladder free; the first pipeline with a demo
data set. Capacity is the closed-loop answer rate with 64 requests in flight; then an open
loop (no coordinated omission) at 0.1 to 4x that rate, 1 s client deadline, reports per step
goodput (full answers within the pipeline's objective) as a share of the peak, the P99 of
admitted requests against the P99 at 0.8x, refusals by code, the busiest load-tool worker's
CPU (a saturated client is visible) and how long the gateway's health took to answer
meanwhile, asked as a gRPC health check on its port and as GET /readyz on its metrics port.
Results go to `--out` (bench/results/overload.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.deployment import running
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import Point, closed, opened, point
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
FRACTIONS = (0.1, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0)


class HealthProbe:
    """Every 50 ms, from its own thread, the gateway's health asked three ways: a
    grpc.health.v1 Check on its public port (a client's view, served among the requests,
    behind every call gRPC has queued on that port), the same Check on its admin port (a
    server of its own in the same process: what a gRPC probe should ask), and GET /readyz on
    its metrics port (what the shipped container and Kubernetes probes ask, answered from the
    metrics server's thread)."""

    def __init__(self, address: str, admin: str, metrics: str) -> None:
        self._stubs = [
            health_pb2_grpc.HealthStub(grpc.insecure_channel(target)) for target in (address, admin)
        ]
        self._readyz = f"http://{metrics}/readyz"
        self._stop = threading.Event()
        self.grpc_seconds: list[float] = []
        self.admin_seconds: list[float] = []
        self.readyz_seconds: list[float] = []
        self._thread = threading.Thread(target=self._probe)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _probe(self) -> None:
        public, admin = self._stubs
        while not self._stop.is_set():
            self.grpc_seconds.append(_timed(lambda: _check(public)))
            self.admin_seconds.append(_timed(lambda: _check(admin)))
            self.readyz_seconds.append(_timed(self._get_readyz))
            time.sleep(0.05)

    def _get_readyz(self) -> None:
        with urllib.request.urlopen(self._readyz, timeout=2) as reply:
            reply.read()


def _check(stub: health_pb2_grpc.HealthStub) -> None:
    stub.Check(health_pb2.HealthCheckRequest(), timeout=2)


def _timed(probe: Callable[[], None]) -> float:
    """Seconds `probe` took; infinity if it failed."""
    started = time.perf_counter()
    try:
        probe()
    except (grpc.RpcError, OSError):
        return float("inf")
    return time.perf_counter() - started


def sweep(
    pool: LoadPool,
    plan: Plan,
    admin: str,
    metrics: str,
    objective: float,
    seconds: float,
    fractions,
) -> list:
    capacity = closed(pool, plan, 64, seconds).throughput()
    print(f"capacity (closed loop, 64 in flight): {capacity:.0f}/s", flush=True)
    rows = []
    for fraction in fractions:
        time.sleep(1.0)
        with HealthProbe(plan.target, admin, metrics) as probe:
            results = opened(pool, plan, fraction * capacity, seconds)
        step = point(f"{fraction:g}x", results, objective, None)
        busiest = results.client()["busiestWorkerCpu"]
        slowest = (
            max(seconds, default=float("nan"))
            for seconds in (probe.grpc_seconds, probe.admin_seconds, probe.readyz_seconds)
        )
        rows.append((step, busiest, *slowest))
        print(row_text(rows[-1]), flush=True)
    return rows


def row_text(row: tuple[Point, float, float, float, float]) -> str:
    step, busiest, health, admin, readyz = row
    return (
        f"{step.label}: offered {step.offered:.0f}/s, goodput {step.goodput:.0f}/s, "
        f"P50 {step.p50_ms:.1f} ms, P99 {step.p99_ms:.1f} ms, errors {step.errors}, "
        f"busiest client worker {busiest:.0%}, slowest gRPC health check "
        f"{health * 1000:.0f} ms (admin port {admin * 1000:.0f} ms), "
        f"slowest /readyz {readyz * 1000:.0f} ms"
    )


def report(rows: list) -> str:
    peak = max(step.goodput for step, *_ in rows)
    base = next((step.p99_ms for step, *_ in rows if step.label == "0.8x"), float("nan"))
    lines = [
        "| load | offered/s | goodput/s | % of peak | P50 ms | P99 ms | P99 / P99 at 0.8x "
        "| errors | busiest client worker | slowest gRPC health check ms: public port "
        "| admin port | slowest /readyz ms |",
        "|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for step, busiest, health, admin, readyz in rows:
        lines.append(
            f"| {step.label} | {step.offered:.0f} | {step.goodput:.0f} | "
            f"{100 * step.goodput / peak:.0f}% | {step.p50_ms:.1f} | {step.p99_ms:.1f} | "
            f"{step.p99_ms / base:.2f} | {step.errors or '-'} | {busiest:.0%} | "
            f"{health * 1000:.0f} | {admin * 1000:.0f} | {readyz * 1000:.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run, well under a minute")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    w = workload(settings, name)
    seconds, fractions = (1.0, (0.8, 2.0, 4.0)) if args.quick else (8.0, FRACTIONS)
    with (
        tempfile.TemporaryDirectory(prefix="strata-") as tmp,
        LoadPool(2) as pool,
        running(args.config, Path(tmp), gateway_metrics=True, gateway_admin=True) as (
            supervisor,
            _,
        ),
    ):
        plan = Plan(
            target=supervisor.address("gateway"),
            method=INFER,
            requests=w.pipeline_requests,
            metadata=CLIENT,
            timeout=1.0,
            connections=2,  # one per client worker, as a tritonclient user has
        )
        front = supervisor.settings.services.gateway
        rows = sweep(
            pool, plan, front.admin_listen, front.metrics, w.objective_seconds, seconds, fractions
        )
        crashed = supervisor.failed()
    table = report(rows)
    print(table)
    print("every process stayed up" if crashed is None else f"{crashed} exited")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.md").write_text(f"# Overload sweep ({name})\n\n{table}\n")
    return 0 if crashed is None else 1


if __name__ == "__main__":
    sys.exit(main())
