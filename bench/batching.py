"""The batching benchmark: `python -m bench.batching --config configs/default.yaml [--quick]`.

1. The ceiling: the model in ONNX Runtime in this process, at every batch size.
2. The inference service as its own process, once per policy (no batching, a fixed window
   per `--windows`, adaptive), each at the same open-loop offered loads, from light to past
   what the service can answer (fractions of a capacity probed first, closed loop).
3. A table of throughput, P50/P95/P99 latency, mean batch size and the ratio to the ceiling,
   printed and saved with a latency-against-throughput plot under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import yaml

from bench import ceiling as ceilings
from bench.openloop import ServiceProcess, open_loop, saturate, settle
from bench.report import Row, summary, table, write
from services.inference import repository, validation
from services.inference.manifest import ModelSpec, read_spec
from strata import codec
from strata.config import Settings, load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Plan:
    seconds: float  # per offered load
    fractions: tuple[float, ...]  # offered loads, as fractions of the probed capacity
    ceiling_seconds: float  # per batch size
    probe_seconds: float


FULL = Plan(3.0, (0.1, 0.3, 0.6, 0.9, 1.2, 1.6), 0.5, 2.0)
QUICK = Plan(0.3, (0.2, 1.3), 0.03, 0.3)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    settings = load_settings(args.config)
    model = args.model or settings.inference.models[0]
    plan = QUICK if args.quick else FULL
    folder, spec, sample = _model(settings, model)
    workers = settings.inference.workers
    ceiling = ceilings.measure(folder, spec, sample, workers, plan.ceiling_seconds)
    print(summary(model, ceiling, settings.inference.workers), flush=True)
    request = codec.build_request(model, sample)
    bound = args.bound if args.bound is not None else max(args.windows)
    policies = [("none", 0.0), *(("fixed", w) for w in args.windows), ("adaptive", bound)]
    policies = [p for p in policies if p[0] in args.policies]
    with tempfile.TemporaryDirectory(prefix="strata-bench-") as scratch:
        rows = _run_all(Path(scratch), args.config, request, policies, plan, ceiling.best)
    print(table(rows), flush=True)
    for path in write(args.out, model, ceiling, settings.inference.workers, rows):
        print(f"wrote {path}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.batching", description=__doc__)
    parser.add_argument("--config", type=Path, required=True, help="deployment YAML file")
    parser.add_argument("--model", help="model to measure (default: the first configured)")
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


def _model(settings: Settings, name: str) -> tuple[Path, ModelSpec, dict[str, np.ndarray]]:
    """The version the service would serve, its spec, and a one-row request from its cases."""
    root = settings.repository / repository.check_name(name)
    spec = read_spec(root / "model.yaml", settings.inference)
    available = repository.versions(root)
    folder = available[spec.version_policy.select(list(available))[-1]]
    cases = validation.read_cases(folder / "validation")
    if not cases:
        raise SystemExit(f"model {name!r} has no validation cases to take a request from")
    sample = {k: v[:1] for k, v in cases[0].inputs.items()}
    return folder, spec, sample


def _run_all(
    scratch: Path,
    config: Path,
    request: v2.ModelInferRequest,
    policies: list[tuple[str, float]],
    plan: Plan,
    ceiling: float,
) -> list[Row]:
    capacity = None
    rows: list[Row] = []
    # The first service measured probes the capacity every policy is then offered fractions
    # of; the adaptive policy (the default) goes first when it is measured.
    for policy, window in sorted(policies, key=lambda p: p[0] != "adaptive"):
        label = policy if policy != "fixed" else f"fixed {window:g} ms"
        path = _config(scratch, config, policy, window, label)
        with ServiceProcess(path, scratch / f"{label.replace(' ', '_')}.log") as service:
            found, runs = asyncio.run(_measure(service.address, request, plan, capacity))
        capacity = capacity or found
        rows += [_row(label, run, batch, ceiling) for run, batch in runs]
        print(f"{label}: done", flush=True)
    order = {label: i for i, label in enumerate(_labels(policies))}
    return sorted(rows, key=lambda r: (order[r.policy], r.offered))


def _labels(policies: list[tuple[str, float]]) -> list[str]:
    return [p if p != "fixed" else f"fixed {w:g} ms" for p, w in policies]


def _config(scratch: Path, config: Path, policy: str, window: float, label: str) -> Path:
    """The deployment config with this policy as every model's batching default."""
    settings = load_settings(config)
    raw = yaml.safe_load(config.read_text())
    raw["repository"] = str(settings.repository)
    batching = raw.setdefault("inference", {}).setdefault("batching", {})
    batching["policy"] = policy
    batching["max_queue_delay_ms"] = window
    path = scratch / f"{label.replace(' ', '_')}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


async def _measure(
    address: str, request: v2.ModelInferRequest, plan: Plan, capacity: float | None
) -> tuple[float, list[tuple]]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        found = await saturate(stub, request, concurrency=64, duration=plan.probe_seconds)
        capacity = capacity or found
        runs = []
        for fraction in plan.fractions:
            before = await _counts(stub, request.model_name)
            run = await open_loop(stub, request, fraction * capacity, plan.seconds, timeout=10)
            after = await _counts(stub, request.model_name)
            batches = after[1] - before[1]
            runs.append((run, (after[0] - before[0]) / batches if batches else 0.0))
            settle()
        return found, runs


async def _counts(stub: v2_grpc.GRPCInferenceServiceStub, model: str) -> tuple[int, int]:
    """Rows answered and batches run so far, over every served version."""
    reply = await stub.ModelStatistics(v2.ModelStatisticsRequest(name=model))
    return (
        sum(s.inference_count for s in reply.model_stats),
        sum(s.execution_count for s in reply.model_stats),
    )


def _row(label: str, run, batch: float, ceiling: float) -> Row:
    refused = {code: n for code, n in run.codes.items() if code != "OK"}
    return Row(
        policy=label,
        offered=run.offered,
        throughput=run.throughput,
        p50_ms=run.percentile(50) * 1e3,
        p95_ms=run.percentile(95) * 1e3,
        p99_ms=run.percentile(99) * 1e3,
        answered=len(run.latencies),
        refused=refused,
        mean_batch=batch,
        ceiling_ratio=run.throughput / ceiling if ceiling else 0.0,
    )


if __name__ == "__main__":
    main()
