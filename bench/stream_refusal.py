"""What C-core's stream refusal refuses: `python -m bench.stream_refusal [--rounds 2]`.

Bare grpc.aio servers (one process each, no Strata), each answering ModelInfer with an empty
answer after `--work-ms` of CPU on its event loop, side by side with different
`grpc.max_concurrent_streams` and `grpc.http.overload_protection`. Each round, each server in
turn: closed loops of 64 and 256 calls in flight on one connection, as tritonclient holds them
(what they see refused UNAVAILABLE is the transport's refusal), then an open loop from one
connection at `--times` the capacity the first server showed (full answers within
`--objective-ms`, refused UNAVAILABLE, DEADLINE_EXCEEDED at `--deadline`). The machine's load
average is printed with the table: compare servers within one run, never across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace

import grpc

from bench.deployment import free_port
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed, opened
from strata.proto.inference import grpc_service_pb2 as v2

ORDINARY = (64, 256)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
# The closed loops' deadline: long enough that a slow moment on a shared machine fails no call,
# so that what fails them is the transport.
PATIENT = 30.0


@dataclass(frozen=True)
class Variant:
    streams: int  # grpc.max_concurrent_streams: advertised, and protection's threshold
    protection: bool  # grpc.http.overload_protection

    @property
    def name(self) -> str:
        return f"{self.streams} streams, protection {'on' if self.protection else 'off'}"


VARIANTS = (Variant(256, False), Variant(256, True), Variant(1024, True), Variant(32, True))


def burn(seconds: float) -> None:
    """Hold the event loop's thread for `seconds` of CPU, as a handler's Python work does."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


async def serve(port: int, variant: Variant, work: float) -> None:
    answer = v2.ModelInferResponse(model_name="bare").SerializeToString()

    async def infer(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        burn(work)
        return answer

    handler = grpc.method_handlers_generic_handler(
        "inference.GRPCInferenceService",
        {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)},
    )
    server = grpc.aio.server(
        options=[
            ("grpc.max_concurrent_streams", variant.streams),
            ("grpc.http.overload_protection", int(variant.protection)),
            ("grpc.so_reuseport", 0),  # a port in use fails the start, never shared
        ]
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


@contextmanager
def servers(work_ms: float) -> Iterator[dict[Variant, str]]:
    """Every variant's server in a process of its own, up at once."""
    started: dict[Variant, str] = {}
    with ExitStack() as stack:
        for variant in VARIANTS:
            port = free_port()
            command = [sys.executable, "-m", "bench.stream_refusal", "--serve", str(port)]
            command += [str(variant.streams), str(int(variant.protection)), str(work_ms)]
            process = subprocess.Popen(command)
            stack.callback(process.wait, 10)
            stack.callback(process.terminate)
            started[variant] = f"127.0.0.1:{port}"
        yield started


@dataclass
class Figures:
    ordinary_refused: dict[int, int]  # in flight: calls refused UNAVAILABLE
    ordinary_calls: dict[int, int]
    goodput: float  # full answers within the objective, per second
    refused: int
    late: int  # DEADLINE_EXCEEDED
    sent: int


def measure(pool: LoadPool, plan: Plan, rate: float, args: argparse.Namespace) -> Figures:
    refused, calls = {}, {}
    patient = replace(plan, timeout=PATIENT)
    for in_flight in ORDINARY:
        results = closed(pool, patient, in_flight, args.seconds)
        refused[in_flight] = int((results.code == UNAVAILABLE).sum())
        calls[in_flight] = results.count
    results = opened(pool, plan, rate, args.seconds)
    return Figures(
        refused,
        calls,
        results.goodput(args.objective_ms / 1e3),
        int((results.code == UNAVAILABLE).sum()),
        int((results.code == DEADLINE).sum()),
        results.count,
    )


def row(variant: Variant, figures: Figures, rate: float) -> str:
    ordinary = " | ".join(
        f"{figures.ordinary_refused[n]} of {figures.ordinary_calls[n]}" for n in ORDINARY
    )
    return (
        f"| {variant.name} | {ordinary} | {rate:.0f} | {figures.goodput:.0f} | "
        f"{figures.refused} | {figures.late} | {figures.sent} |"
    )


HEADER = (
    "| server | refused at 64 in flight | refused at 256 in flight | open loop offered/s "
    "| goodput/s | refused (UNAVAILABLE) | DEADLINE_EXCEEDED | sent |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|"
)


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.serve:
        port, streams, protection, work_ms = args.serve
        variant = Variant(int(streams), bool(int(protection)))
        asyncio.run(serve(int(port), variant, float(work_ms) / 1e3))
        return 0
    request = v2.ModelInferRequest(model_name="bare").SerializeToString()
    lines = [HEADER]
    with servers(args.work_ms) as targets, ExitStack() as stack:
        pool = LoadPool(1)
        stack.callback(pool.close)
        plans = {
            v: Plan(target=t, method=INFER, requests=(request,), timeout=args.deadline)
            for v, t in targets.items()
        }
        first = plans[VARIANTS[0]]
        capacity = closed(pool, first, 64, args.seconds).throughput()
        rate = args.times * capacity
        print(f"capacity (64 in flight, {VARIANTS[0].name}): {capacity:.0f}/s", flush=True)
        for _ in range(args.rounds):
            for variant, plan in plans.items():
                lines.append(row(variant, measure(pool, plan, rate, args), rate))
                print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"load average at the end: {', '.join(f'{n:.1f}' for n in os.getloadavg())}")
    return 0


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.stream_refusal", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2, help="every server once a round")
    parser.add_argument("--seconds", type=float, default=2.0, help="each loop's length")
    parser.add_argument("--work-ms", type=float, default=1.0, help="CPU per call, ms")
    parser.add_argument("--times", type=float, default=3.0, help="open loop, x capacity")
    parser.add_argument("--objective-ms", type=float, default=250.0)
    parser.add_argument("--deadline", type=float, default=1.0, help="every call's, seconds")
    parser.add_argument("--serve", nargs=4, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
