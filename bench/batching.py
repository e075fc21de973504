"""The batching benchmark: `python -m bench.batching --config configs/default.yaml [--quick]`.

For the configured model (the first one the first deployment loads, unless `--model`) and a
synthetic compute-bound MLP (bench/synthetic.py; `--no-synthetic` leaves it out):

1. The ceiling: the model in ONNX Runtime in this process, at every batch size.
2. The inference service as its own process, one per policy (no batching, a fixed window per
   `--windows`, adaptive), all started side by side; at each open-loop offered load, from
   light to past what the service answers (fractions of a capacity probed first, closed
   loop), every policy runs in turn, the order rotating from load to load, so that a noisy
   neighbour on the machine hits them all alike.
3. A table of throughput, P50/P95/P99 latency, mean batch size and the ratio to the ceiling,
   printed and saved with a latency-against-throughput plot under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path

import grpc
import yaml

from bench import ceiling as ceilings
from bench import synthetic
from bench.openloop import Run, ServiceProcess, open_loop, saturate, settle
from bench.report import Measured, Plan, Row, digest, table, write
from services.inference import validation
from services.inference.manifest import read_spec
from strata.config import Settings, load_settings
from strata.models import repository
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec

RESULTS = Path(__file__).resolve().parent / "results"
FULL = Plan(3.0, (0.1, 0.3, 0.6, 0.9, 1.2, 1.6), 0.5, 2.0)
QUICK = Plan(0.3, (0.2, 1.3), 0.03, 0.3)


def main(argv: list[str] | None = None) -> None:
    """Run the batching benchmark and write its results."""
    args = _parser().parse_args(argv)
    settings = load_settings(args.config)
    plan = QUICK if args.quick else FULL
    bound = args.bound if args.bound is not None else max(args.windows)
    policies = [("none", 0.0), *(("fixed", w) for w in args.windows), ("adaptive", bound)]
    policies = [p for p in policies if p[0] in args.policies]
    loaded = settings.models_of(settings.deployment)
    names = [args.model or loaded[0]]
    names += [] if args.no_synthetic else [synthetic.NAME]
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as folder:
        scratch = Path(folder)
        root = synthetic.write_repository(scratch, settings.repository, loaded)
        results = [_ceiling(settings, root, name, plan) for name in names]
        configs = [_config(scratch, args.config, root, p, w) for p, w in policies]
        with ExitStack() as stack:
            services = _start(stack, scratch, configs)
            for result in results:
                asyncio.run(_measure(services, result, plan))
                print(f"{table(result.rows)}\n\n{digest(result.rows)}\n", flush=True)
    for path in write(args.out, results, plan):
        print(f"wrote {path}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.batching",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", type=Path, required=True, help="deployment YAML file")
    parser.add_argument("--model", help="model to measure (default: the first configured)")
    parser.add_argument("--no-synthetic", action="store_true", help="leave out the MLP")
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument(
        "--windows",
        type=lambda s: [float(w) for w in s.split(",")],
        default=[1.0, 4.0],
        help="fixed windows to measure, ms, comma-separated (default 1,4)",
    )
    parser.add_argument(
        "--bound",
        type=float,
        help="the adaptive policy's upper wait bound, ms (default: the longest window)",
    )
    parser.add_argument(
        "--policies",
        type=lambda s: s.split(","),
        default=["none", "fixed", "adaptive"],
        help="policies to measure, comma-separated (default none,fixed,adaptive)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    return parser


def _ceiling(settings: Settings, root: Path, name: str, plan: Plan) -> Measured:
    """The model as the service would serve it, a one-row request, and its ceiling."""
    folder = root / repository.check_name(name)
    spec = read_spec(folder / "model.yaml", settings.inference)
    available = repository.versions(folder)
    version = available[spec.version_policy.select(list(available))[-1]]
    cases = validation.read_cases(version / "validation")
    if not cases:
        raise SystemExit(f"model {name!r} has no validation cases to take a request from")
    sample = {k: v[:1] for k, v in cases[0].inputs.items()}
    workers = settings.inference.workers
    found = ceilings.measure(version, spec, sample, workers, plan.ceiling_seconds)
    print(f"{name}: in-process ceiling {found.best:,.0f} rows/s at batch {found.best_batch}")
    return Measured(name, found, workers, codec.build_request(name, sample))


def _config(scratch: Path, config: Path, root: Path, policy: str, window: float) -> Path:
    """The deployment config on the scratch repository, with this policy as the default."""
    raw = yaml.safe_load(config.read_text())
    raw["repository"] = str(root)
    for endpoint in raw["services"]["inference"].values():
        endpoint.pop("metrics", None)  # the services run side by side: no shared metrics port
    # One long-lived connection per service, however many calls are in flight past capacity:
    # the benchmark measures the batcher, not reconnects or the stream limit.
    raw.setdefault("server", {}).update(
        max_connection_age_seconds=24 * 3600, max_concurrent_streams=1 << 20
    )
    inference = raw.setdefault("inference", {})
    inference["models"] = sorted(p.name for p in root.iterdir())  # the models linked, and mlp
    inference.setdefault("batching", {}).update(policy=policy, max_queue_delay_ms=window)
    path = scratch / f"{_label(policy, window).replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _label(policy: str, window: float) -> str:
    return f"fixed {window:g} ms" if policy == "fixed" else policy


def _start(stack: ExitStack, scratch: Path, configs: list[Path]) -> dict[str, ServiceProcess]:
    """Every policy's service, started together."""
    services = {}
    for path in configs:
        raw = yaml.safe_load(path.read_text())["inference"]["batching"]
        label = _label(raw["policy"], raw["max_queue_delay_ms"])
        services[label] = ServiceProcess(path, scratch / f"{path.stem}.log")
        services[label].start()
        stack.callback(services[label].stop)
    for service in services.values():
        service.ready()
    return services


async def _measure(services: dict[str, ServiceProcess], result: Measured, plan: Plan) -> None:
    async with AsyncExitStack() as stack:
        stubs = {}
        for label, service in services.items():
            channel = await stack.enter_async_context(grpc.aio.insecure_channel(service.address))
            stubs[label] = v2_grpc.GRPCInferenceServiceStub(channel)
        labels = list(stubs)
        probe = "adaptive" if "adaptive" in stubs else labels[0]
        for label in labels:  # warms every service; the probe's capacity sets the loads
            found = await saturate(stubs[label], result.request, 64, plan.probe_seconds)
            result.capacity = found if label == probe else result.capacity
        for i, fraction in enumerate(plan.fractions):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                row = await _one(stubs[label], label, result, fraction * result.capacity, plan)
                result.rows.append(row)
                settle()
        order = {label: i for i, label in enumerate(labels)}
        result.rows.sort(key=lambda r: (order[r.policy], r.offered))


async def _one(
    stub: v2_grpc.GRPCInferenceServiceStub, label: str, result: Measured, rate: float, plan: Plan
) -> Row:
    before = await _counts(stub, result.model)
    run = await open_loop(stub, result.request, rate, plan.seconds, timeout=10)
    after = await _counts(stub, result.model)
    batches = after[1] - before[1]
    return _row(label, run, (after[0] - before[0]) / batches if batches else 0.0, result)


async def _counts(stub: v2_grpc.GRPCInferenceServiceStub, model: str) -> tuple[int, int]:
    """Rows answered and batches run so far, over every served version."""
    reply = await stub.ModelStatistics(v2.ModelStatisticsRequest(name=model))
    return (
        sum(s.inference_count for s in reply.model_stats),
        sum(s.execution_count for s in reply.model_stats),
    )


def _row(label: str, run: Run, batch: float, result: Measured) -> Row:
    return Row(
        model=result.model,
        policy=label,
        offered=run.offered,
        throughput=run.throughput,
        p50_ms=run.percentile(50) * 1e3,
        p95_ms=run.percentile(95) * 1e3,
        p99_ms=run.percentile(99) * 1e3,
        answered=len(run.latencies),
        refused={code: n for code, n in run.codes.items() if code != "OK"},
        mean_batch=batch,
        ceiling_ratio=run.throughput / result.ceiling.best if result.ceiling.best else 0.0,
    )


if __name__ == "__main__":
    main()
