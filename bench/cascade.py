"""A cascade against its large model: `python -m bench.cascade --config configs/default.yaml
[--quick]`.

The config's cascade pipeline (digits-cascade: digits answers, digits-large only the rows
digits is unsure of) is measured in one run against the same pipeline with the large model
alone, and against a chain that always runs both models, all three in one system on free
ports with the ladder pinned at level 0:

- accuracy on the held-out digits set (build/data/digits_test.npz), one row per request, and
  the share of rows the large model answered (strata.stages);
- capacity (closed loop, many requests in flight) with requests of 1 and of 16 rows: rows
  per second and P99, best of alternating rounds so that a noisy neighbour hits every
  pipeline alike. With one row per request the chain's cost per request dominates (on a
  small machine it is many times the large model's cost per row); with 16 the models' does;
- light load (one request at a time): P50 and P99, where the always-both chain against the
  large model alone shows what a second stage adds (its model and one inference hop);
- the gateway's CPU per request in each of those runs (the median of the rounds), where the
  always-both chain against the large model alone shows what the gateway spends on a later
  stage: running it, and its inference call. On a shared machine it moves less with a
  neighbour's load than latency and throughput do;
- with configs/text.yaml, which also serves `topics` (MiniLM and its topic head in one graph)
  and `topics-staged` (the same two parts as two stages), both at light load on one
  connection: what splitting one graph into two stages costs.

Results go to `--out` as cascade.md and cascade.json.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import grpc
import numpy as np
import psutil
import yaml

from bench.admin import Admin
from bench.deployment import running
from bench.load import LoadPool, Plan, Results
from bench.load.data import DATASETS, from_arrays
from bench.load.worker import INFER
from bench.measure import Point, closed, point
from bench.report import machine
from bench.suite_report import clean
from bench.text import sentences
from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
CASCADE = "digits-cascade"
LARGE = "digits-large-only"  # the cascade's pipeline with its large model alone
BOTH = "digits-then-large"  # the cascade's pipeline running both models for every row
ROWS = (1, 16)  # rows per request in the capacity runs
TOPICS = ("topics", "topics-staged")  # configs/text.yaml: one graph, and the same as two stages


@dataclass(frozen=True)
class Timing:
    rounds: int
    warmup_seconds: float
    capacity_seconds: float
    light_seconds: float
    concurrency: int


FULL = Timing(3, 1.0, 6.0, 4.0, 64)
QUICK = Timing(1, 0.2, 0.8, 0.6, 8)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    timing = QUICK if args.quick else FULL
    data = np.load(DATASETS / "digits_test.npz")
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(LoadPool(args.workers))
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        config = _with_baselines(args.config, tmp)
        supervisor, token = stack.enter_context(running(config, tmp))
        admin = Admin(supervisor.address("gateway"), token)
        stack.callback(admin.close)
        admin.force(0)
        gateway = supervisor.address("gateway")
        print("system up", flush=True)
        accuracy = {name: _accuracy(gateway, name, data) for name in (CASCADE, LARGE)}
        print(f"accuracy: {json.dumps(accuracy)}", flush=True)
        process = psutil.Process(supervisor.processes["gateway"].pid)
        measured, cpu = _load(pool, gateway, data, timing, process)
        split = _split_cost(pool, gateway, supervisor.settings.pipelines, timing)
    report = _report(args.config, accuracy, measured, cpu, timing, split)
    print(_markdown(report))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "cascade.md").write_text(_markdown(report))
    (args.out / "cascade.json").write_text(json.dumps(clean(report), indent=2))
    print(f"wrote {args.out / 'cascade.md'}\nwrote {args.out / 'cascade.json'}")
    return 0


def _with_baselines(config: Path, folder: Path) -> Path:
    """`config` with the cascade's two baselines beside it: its large model alone, and both
    models for every row (the large one's answer replacing the small one's)."""
    raw = yaml.safe_load(config.read_text())
    raw["repository"] = str(load_settings(config).repository)
    pipelines = raw["pipelines"]
    if CASCADE not in pipelines:
        raise SystemExit(f"{config} has no pipeline {CASCADE!r} to measure")
    cascade = pipelines[CASCADE]
    large = copy.deepcopy(cascade)
    large["model"] = cascade["stages"][0]["model"]
    del large["stages"]
    both = copy.deepcopy(cascade)
    del both["stages"][0]["when"]
    pipelines[LARGE], pipelines[BOTH] = large, both
    path = folder / "cascade.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _accuracy(gateway: str, pipeline: str, data: np.lib.npyio.NpzFile) -> dict:
    """Top-1 accuracy on the held-out set, one row per request, and the share of rows the
    second model answered."""
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(gateway))
    images, labels = data["images"], data["labels"]

    def one(row: int) -> tuple[int, bool]:
        request = codec.build_request(pipeline, {"images": images[row : row + 1]})
        reply = stub.ModelInfer(request, metadata=CLIENT, timeout=30)
        label = int(codec.response_outputs(reply)["labels"][0, 0])
        return label, "," in reply.parameters["strata.stages"].string_param

    with ThreadPoolExecutor(8) as threads:
        answers = list(threads.map(one, range(len(labels))))
    predicted = np.array([label for label, _ in answers])
    return {
        "rows": len(labels),
        "accuracy": float((predicted == labels).mean()),
        "second_stage_share": float(np.mean([second for _, second in answers])),
    }


def _load(
    pool: LoadPool, gateway: str, data: np.lib.npyio.NpzFile, t: Timing, process: psutil.Process
) -> tuple[dict[str, dict[str, list[Point]]], dict[str, dict[str, list[float]]]]:
    """Each pipeline's capacity with requests of each size, and its latency at light load
    (one row, one request at a time), rounds alternating their order; and the gateway's CPU
    ms per request in each run (`process`: the gateway's)."""
    names = [CASCADE, LARGE, BOTH]
    runs = [*(f"capacity_{r}" for r in ROWS), "light"]
    measured: dict[str, dict[str, list[Point]]] = {n: {run: [] for run in runs} for n in names}
    cpu: dict[str, dict[str, list[float]]] = {n: {run: [] for run in runs} for n in names}
    for round_ in range(t.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            for rows in ROWS:
                plan = _plan(gateway, name, data, rows)
                closed(pool, plan, 4, t.warmup_seconds)
                run = f"capacity_{rows}"
                capacity = _with_cpu(
                    process,
                    cpu[name][run],
                    partial(closed, pool, plan, t.concurrency, t.capacity_seconds),
                )
                measured[name][run].append(point("capacity", capacity, 1.0))
            plan = _plan(gateway, name, data, 1)
            light = _with_cpu(
                process, cpu[name]["light"], partial(closed, pool, plan, 1, t.light_seconds)
            )
            measured[name]["light"].append(point("light", light, 1.0))
            figures = {r: round(_rows_per_second(measured[name], r)[-1]) for r in ROWS}
            print(f"{name}: rows/s by rows per request {figures}", flush=True)
    return measured, cpu


def _with_cpu(process: psutil.Process, into: list[float], run: Callable[[], Results]) -> Results:
    """`run()`'s results; appends to `into` the CPU ms `process` spent per request of it."""
    before = sum(process.cpu_times()[:2])  # user, system
    results = run()
    into.append(1e3 * (sum(process.cpu_times()[:2]) - before) / max(results.count, 1))
    return results


def _split_cost(pool: LoadPool, gateway: str, served: dict, t: Timing) -> dict[str, list[Point]]:
    """`topics` and `topics-staged` at light load (one request of one text at a time, on
    one connection), rounds alternating their order; none where the config lacks them."""
    if not set(TOPICS) <= set(served):
        return {}
    texts = np.array([text.encode() for text in sentences(0, 64)], dtype=object)
    measured: dict[str, list[Point]] = {name: [] for name in TOPICS}
    for round_ in range(t.rounds):
        for name in TOPICS if round_ % 2 == 0 else TOPICS[::-1]:
            requests = tuple(from_arrays(name, {"text": texts}))
            plan = Plan(gateway, INFER, requests, CLIENT, timeout=30, connections=1)
            closed(pool, plan, 1, t.warmup_seconds)
            measured[name].append(point("light", closed(pool, plan, 1, t.light_seconds), 1.0))
    return measured


def _plan(gateway: str, pipeline: str, data: np.lib.npyio.NpzFile, rows: int) -> Plan:
    requests = tuple(from_arrays(pipeline, {"images": data["images"]}, batch=rows))
    return Plan(gateway, INFER, requests, CLIENT, timeout=30, connections=8)


def _rows_per_second(measured: dict[str, list[Point]], rows: int) -> list[float]:
    return [p.throughput * rows for p in measured[f"capacity_{rows}"]]


def _report(
    config: Path, accuracy: dict, measured: dict, cpu: dict, timing: Timing, split: dict
) -> dict:
    light = {n: min(m["light"], key=lambda p: p.p50_ms) for n, m in measured.items()}
    text = {n: min(points, key=lambda p: p.p50_ms) for n, points in split.items()}
    capacity = {}
    for rows in ROWS:
        best = {
            n: max(m[f"capacity_{rows}"], key=lambda p: p.throughput) for n, m in measured.items()
        }
        capacity[str(rows)] = {
            "throughput_ratio": best[CASCADE].throughput / max(best[LARGE].throughput, 1e-9),
            # Each round measures the two one after the other: the ratio a noisy neighbour
            # moves least, and its spread says how far to trust the best-of ratio.
            "round_ratios": [
                c.throughput / max(large.throughput, 1e-9)
                for c, large in zip(
                    measured[CASCADE][f"capacity_{rows}"],
                    measured[LARGE][f"capacity_{rows}"],
                    strict=True,
                )
            ],
            "rows_per_second": {n: p.throughput * rows for n, p in best.items()},
            "best": {n: p.as_dict() for n, p in best.items()},
            "rounds": {n: _rows_per_second(m, rows) for n, m in measured.items()},
        }
    return {
        "machine": machine(),
        "config": str(config),
        "timing": timing.__dict__,
        "accuracy": accuracy,
        "accuracy_gap_points": 100 * (accuracy[LARGE]["accuracy"] - accuracy[CASCADE]["accuracy"]),
        "capacity": capacity,
        "second_stage_ms_at_c1": light[BOTH].p50_ms - light[LARGE].p50_ms,
        "gateway_cpu_ms_per_request": {
            n: {run: float(np.median(values)) for run, values in runs.items()}
            for n, runs in cpu.items()
        },
        "light": {n: p.as_dict() for n, p in light.items()},
        "split": {n: p.as_dict() for n, p in text.items()},
    }


def _markdown(report: dict) -> str:
    t, acc = report["timing"], report["accuracy"]
    cap, light = report["capacity"], report["light"]
    cpu = report["gateway_cpu_ms_per_request"]
    lines = [
        "# A cascade against its large model",
        "",
        f"Machine: {report['machine']}. Config: `{report['config']}`, ladder pinned at level 0; "
        f"best of {t['rounds']} alternating rounds, {t['concurrency']} requests in flight; light "
        "load: one request at a time; one row per request.",
        "",
        f"- accuracy on the held-out set ({acc[CASCADE]['rows']} rows): cascade "
        f"{acc[CASCADE]['accuracy']:.2%}, large model alone {acc[LARGE]['accuracy']:.2%} "
        f"(gap {report['accuracy_gap_points']:.2f} points; target ≤ 0.5); the large model "
        f"answered {acc[CASCADE]['second_stage_share']:.1%} of the cascade's rows",
        *[
            f"- throughput with {rows}-row requests: cascade / large alone = "
            f"{cap[str(rows)]['throughput_ratio']:.2f} (target ≥ 1.5); round by round "
            f"{', '.join(f'{r:.2f}' for r in cap[str(rows)]['round_ratios'])}"
            for rows in ROWS
        ],
        f"- a second stage at c=1 (both models every row, against the large one alone): "
        f"{report['second_stage_ms_at_c1']:+.2f} ms at P50, "
        f"{cpu[BOTH]['light'] - cpu[LARGE]['light']:+.2f} ms of the gateway's CPU per request "
        f"({cpu[BOTH]['capacity_1'] - cpu[LARGE]['capacity_1']:+.2f} ms at capacity)",
        "",
        "| pipeline | rows/s (1-row requests) | P99 ms | rows/s (16-row requests) | P99 ms "
        "| c=1 P50 ms | c=1 P99 ms | gateway CPU ms/request: c=1 | 1-row capacity |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name in (CASCADE, LARGE, BOTH):
        sizes = [cap[str(rows)] for rows in ROWS]
        cells = " | ".join(
            f"{c['rows_per_second'][name]:,.0f} | {c['best'][name]['p99_ms']:.1f}" for c in sizes
        )
        lines.append(
            f"| {name} | {cells} | {light[name]['p50_ms']:.2f} | {light[name]['p99_ms']:.2f} "
            f"| {cpu[name]['light']:.2f} | {cpu[name]['capacity_1']:.2f} |"
        )
    return "\n".join([*lines, *_split_lines(report["split"])]) + "\n"


def _split_lines(split: dict) -> list[str]:
    """The topics graph against its two parts as two stages, where they were measured."""
    if not split:
        return []
    whole, staged = (split[name] for name in TOPICS)
    return [
        "",
        f"One graph against its two parts as two stages, one text per request, one at a time "
        f"on one connection: `{TOPICS[1]}` adds {staged['p50_ms'] - whole['p50_ms']:+.2f} ms "
        f"at P50 to `{TOPICS[0]}`.",
        "",
        "| pipeline | c=1 P50 ms | c=1 P99 ms | requests |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {p['p50_ms']:.2f} | {p['p99_ms']:.2f} | {p['count']} |"
            for name, p in split.items()
        ),
    ]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cascade", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--workers", type=int, default=2, help="load tool processes")
    return parser


if __name__ == "__main__":
    sys.exit(main())
