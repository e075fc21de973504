"""What a refusal costs a grpc.aio server: `python -m bench.refusal_cost [--calls 5000]`.

A bare grpc.aio server (one process, no Strata) per way of answering a unary call, each
measured in turn by the CPU seconds its process spent per call (the load on a shared machine
disturbs that less than a rate): an empty answer; a refusal from the handler, by
`context.abort` (what the gateway's door does) and by `set_code` and returning; a refusal by
grpc.aio's own `maximum_concurrent_rpcs` limiter (in Cython, before any handler: one call
holds the only place); a call of a method the server does not have (UNIMPLEMENTED, also
before any handler). Each from one connection, `--in-flight` calls at once. The question it
answers: how much cheaper than an answer a refusal can be in the server's own process, where
every call is still accepted from C-core and completed through the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections import Counter

import grpc

from bench.deployment import free_port

WAYS = ("answer", "abort", "set_code", "limiter", "unimplemented")
HINT = (("retry-after-ms", "10"),)
WARM_UP = 200  # calls before the measured ones


async def serve(port: int, way: str) -> None:
    async def call(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        if way == "abort":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "full", HINT)
        if way == "set_code":
            context.set_trailing_metadata(HINT)
            context.set_code(grpc.StatusCode.RESOURCE_EXHAUSTED)
            context.set_details("full")
        return b""

    async def hold(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(3600)
        return b""

    handler = grpc.method_handlers_generic_handler(
        "bench.Refusal",
        {
            "Call": grpc.unary_unary_rpc_method_handler(call),
            "Hold": grpc.unary_unary_rpc_method_handler(hold),
        },
    )
    server = grpc.aio.server(
        maximum_concurrent_rpcs=1 if way == "limiter" else None,
        options=[("grpc.so_reuseport", 0)],  # a port in use fails the start, never shared
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds `pid` has spent (every thread)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(pid: int, port: int, way: str, calls: int, in_flight: int) -> tuple[float, str]:
    """CPU microseconds the server spent per call, and the status codes the calls ended with."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        await channel.channel_ready()
        method = "/bench.Refusal/Missing" if way == "unimplemented" else "/bench.Refusal/Call"
        send = channel.unary_unary(method)
        if way == "limiter":
            held = asyncio.ensure_future(channel.unary_unary("/bench.Refusal/Hold")(b""))
            await asyncio.sleep(0.3)
        codes: Counter[str] = Counter()
        places = asyncio.Semaphore(in_flight)

        async def one() -> None:
            async with places:
                try:
                    await send(b"x", timeout=30)
                    codes["OK"] += 1
                except grpc.aio.AioRpcError as exc:
                    codes[exc.code().name] += 1

        await asyncio.gather(*(one() for _ in range(WARM_UP)))
        codes.clear()
        before = cpu_seconds(pid)
        await asyncio.gather(*(one() for _ in range(calls)))
        spent = cpu_seconds(pid) - before
        if way == "limiter":
            held.cancel()
    return spent / calls * 1e6, ", ".join(f"{code} {n}" for code, n in codes.items())


def run(way: str, args: argparse.Namespace) -> str:
    port = free_port()
    command = [sys.executable, "-m", "bench.refusal_cost", "--serve", str(port), way]
    server = subprocess.Popen(command)
    try:
        time.sleep(1.0)
        micros, codes = asyncio.run(measure(server.pid, port, way, args.calls, args.in_flight))
    finally:
        server.terminate()
        server.wait(10)
    return f"| {way} | {micros:.0f} | {codes} |"


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.serve:
        asyncio.run(serve(int(args.serve[0]), args.serve[1]))
        return 0
    lines = ["| way | server CPU per call, us | status codes |", "|---|---:|---|"]
    for _ in range(args.rounds):
        for way in WAYS:
            lines.append(run(way, args))
            print(lines[-1], flush=True)
    print("\n".join(lines))
    print(f"load average at the end: {', '.join(f'{n:.1f}' for n in os.getloadavg())}")
    return 0


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.refusal_cost", description=__doc__)
    parser.add_argument("--calls", type=int, default=5000, help="measured calls per way")
    parser.add_argument("--in-flight", type=int, default=64, help="calls at once")
    parser.add_argument("--rounds", type=int, default=2, help="every way once a round")
    parser.add_argument("--serve", nargs=2, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main())
