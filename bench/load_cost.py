"""What the load tool costs its own machine, per call and per sender:
`python -m bench.load_cost --config configs/default.yaml [--quick] [--rates 1000,2000,4000]`.

The load tool shares the cores of what it measures (bench.overload), so its CPU per call is
CPU the server does not get. A trivial v2 server in a process of its own answers every
ModelInfer with one prepared answer shaped like the gateway's (the strata.* parameters
included, so the sender reads its flags as it would the gateway's); the tool sends the first
pipeline's demo requests from one worker on two connections, in an open loop at each rate and
a closed loop of 16, through each sender in turn (Python, and the compiled sender where `make
load-sender` built it), round after round, so that a change in the machine's load falls on
both. Per sender and run: CPU per call (the worker's CPU seconds over its calls, the compiled
sender's process included; the median and range over the rounds), the cores it took and how
late it sent (P99). The machine's load average ends the table: on a busy machine the figures
give a direction only. Results go to `--out` (bench/results/load_cost.md).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import grpc
import numpy as np

from bench.deployment import free_port
from bench.load import LoadPool, Plan, native
from bench.load.worker import INFER
from bench.workloads import has_dataset, workload
from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

RESULTS = Path(__file__).resolve().parent / "results"
RATES = "1000,2000,4000"
CLOSED = 16


def answer() -> bytes:
    """A full answer as the gateway gives one for a digit: a label, ten scores, parameters."""
    message = v2.ModelInferResponse(model_name="digits", model_version="1")
    parameters = message.parameters
    parameters["strata.arm"].string_param = "main"
    parameters["strata.model_version"].string_param = "1"
    parameters["strata.level"].int64_param = 0
    parameters["strata.degraded"].bool_param = False
    outputs = {"label": np.array([3]), "probabilities": np.zeros((1, 10), np.float32)}
    codec.add_outputs(message, outputs)
    return message.SerializeToString()


def serve(port: int, reply: bytes) -> None:
    """Process entry: answer every ModelInfer with `reply` until terminated."""
    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(lambda request, context: reply)},
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    server.wait_for_termination()


@contextmanager
def trivial_server() -> Iterator[str]:
    port = free_port()
    process = multiprocessing.get_context("spawn").Process(
        target=serve, args=(port, answer()), name="bench-load-cost-server", daemon=True
    )
    process.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join()


def runs(rates: list[float], seconds: float) -> list[tuple[str, dict]]:
    """Each run's label and how it differs from the base plan."""
    opened = [(f"open loop {r:g}/s", {"rps": r, "duration": seconds}) for r in rates]
    closed = [(f"closed loop of {CLOSED}", {"concurrency": CLOSED, "duration": seconds})]
    return opened + closed


Found = dict[tuple[str, str], list[tuple[float, float, float]]]


def measure(
    plan: Plan, senders: list[str], rates: list[float], seconds: float, rounds: int
) -> Found:
    """{(run, sender): [(µs per call, cores, lag P99 ms) per round]}."""
    found: Found = {}
    with LoadPool(1) as pool:
        pool.run(replace(plan, concurrency=8, total=400))  # connections up, caches warm
        for _ in range(rounds):
            for label, changes in runs(rates, seconds):
                for sender in senders:
                    results = pool.run(replace(plan, sender=sender, total=None, **changes))
                    client = results.client()
                    per_call = client["cpuSeconds"] / max(results.count, 1) * 1e6
                    row = (per_call, client["cores"], client["sendLagP99"] * 1e3)
                    found.setdefault((label, sender), []).append(row)
                    print(f"{label}, {sender}: {per_call:.0f} µs a call", flush=True)
    return found


def table(found: Found) -> str:
    lines = [
        "| run | sender | CPU µs a call (median, range) | cores | sends late P99 ms |",
        "|---|---|---|---|---|",
    ]
    for (label, sender), rows in found.items():
        per_call = [r[0] for r in rows]
        lines.append(
            f"| {label} | {sender} | {statistics.median(per_call):.0f} "
            f"({min(per_call):.0f}-{max(per_call):.0f}) "
            f"| {statistics.median(r[1] for r in rows):.2f} "
            f"| {statistics.median(r[2] for r in rows):.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    settings = load_settings(args.config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    requests = workload(settings, name).pipeline_requests
    rates = [1000.0] if args.quick else [float(r) for r in args.rates.split(",")]
    seconds, rounds = (1.0, 1) if args.quick else (args.seconds, args.rounds)
    with trivial_server() as address:
        plan = Plan(target=address, method=INFER, requests=requests, connections=2, timeout=1.0)
        why = native.why_not(plan)
        senders = ["python"] if why else ["python", "compiled"]
        said = f"the Python sender only ({why})" if why else "both senders, in turn"
        print(said, flush=True)
        found = measure(plan, senders, rates, seconds, rounds)
    load = ", ".join(f"{n:.1f}" for n in os.getloadavg())
    text = (
        f"{table(found)}\n\n{said}; {rounds} round(s) of {seconds:g} s "
        f"each. The machine has {os.cpu_count()} cores; its load average at the end: {load}."
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "load_cost.md").write_text(f"# The load tool's CPU per call ({name})\n\n{text}\n")
    return 0


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.load_cost", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run, a few seconds")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--seconds", type=float, default=4.0, help="each run's length")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each kind, in turn")
    parser.add_argument(
        "--rates", default=RATES, help=f"the open loops' rates, comma-separated ({RATES})"
    )
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
