"""A stream message's cost over gRPC against a pipe (strata.rpc.pipes), A/B against one server:
`python -m bench.pipes [--messages 4000] [--in-flight 1,8] [--rounds 4]`.

One server process serves an echo ProcessStream (each message answered with its tag) both on
a gRPC port (grpc.aio, the services' transport: strata.process.transport) and on a pipe. This
process sends it `--messages` small messages (a lane's: a tag and a slab ref) on one stream,
`--in-flight` at a time, over each transport in turn, in rounds that alternate which goes
first; the medians of CPU microseconds a message, for the caller (this process) and the
server, are printed per transport and number in flight. A direction, not a benchmark: run it
on a quiet machine for figures.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import uvloop

import strata.process.transport  # noqa: F401  (first: the services' gRPC transport)
from bench.deployment import free_port
from bench.peers.cpu import cpu_seconds
from strata.proto.v1 import (
    preprocess_pb2,  # noqa: F401  (its service, to the descriptor pool)
    preprocess_pb2_grpc,
)
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.pipes import (
    PipeCall,
    PipeServer,
    own_folder,
    pipe_folder,
    pipe_path,
    stream_methods,
)

SERVICE = "strata.v1.Preprocess"
METHOD = f"/{SERVICE}/ProcessStream"
LIMIT = 16 << 20
MESSAGE = v1.ProcessRequest(
    requests=[v1.Request(id="1", pipeline="p", tensors=[v1.Tensor(name="t", slab="k:1:2:3")])]
)


class Echo(preprocess_pb2_grpc.PreprocessServicer):
    async def ProcessStream(
        self, requests: AsyncIterator[v1.ProcessRequest], context: Any
    ) -> AsyncIterator[v1.ProcessResponse]:
        async for request in requests:
            yield v1.ProcessResponse(tag=request.tag)


async def _serve(listen: str, path: Path) -> None:
    server = grpc.aio.server()
    preprocess_pb2_grpc.add_PreprocessServicer_to_server(Echo(), server)
    server.add_insecure_port(listen)
    await server.start()
    pipe = PipeServer(path, listen, stream_methods(Echo(), SERVICE), LIMIT, 8)
    await pipe.start()
    await server.wait_for_termination()


def _server(listen: str, path: Path) -> None:
    uvloop.run(_serve(listen, path))


async def _round(call: Any, messages: int, in_flight: int) -> float:
    """This process's CPU seconds for `messages` round trips, `in_flight` at a time."""
    for tag in range(1, 51):  # warm
        MESSAGE.tag = tag
        await call.write(MESSAGE)
        await call.read()
    started = time.process_time()
    for _ in range(messages // in_flight):
        for tag in range(in_flight):
            MESSAGE.tag = tag + 1
            await call.write(MESSAGE)
        for _ in range(in_flight):
            await call.read()
    return time.process_time() - started


async def _measure(
    listen: str, path: Path, transport: str, messages: int, in_flight: int, server: int
) -> tuple[float, float]:
    """(caller, server) CPU microseconds a message over `transport`."""
    async with grpc.aio.insecure_channel(listen) as channel:
        if transport == "grpc":
            call: Any = preprocess_pb2_grpc.PreprocessStub(channel).ProcessStream()
        else:
            call = PipeCall(path, METHOD, v1.ProcessResponse, listen, LIMIT)
        before = cpu_seconds(server) or 0.0
        caller = await _round(call, messages, in_flight)
        served = (cpu_seconds(server) or 0.0) - before
        await call.done_writing()
        while await call.read() is not grpc.aio.EOF:
            pass
    return caller / messages * 1e6, served / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=4000)
    parser.add_argument("--in-flight", default="1,8")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    levels = [int(n) for n in args.in_flight.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        folder = pipe_folder(Path(tmp))
        own_folder(folder, create=True)
        listen = f"127.0.0.1:{free_port()}"
        path = pipe_path(folder, listen)
        process = multiprocessing.get_context("fork").Process(
            target=_server, args=(listen, path), daemon=True
        )
        process.start()
        while not path.exists():
            time.sleep(0.05)
        figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for number in range(args.rounds):
            order = ("grpc", "pipe") if number % 2 == 0 else ("pipe", "grpc")
            for level in levels:
                for transport in order:
                    pid = process.pid or os.getpid()
                    run = _measure(listen, path, transport, args.messages, level, pid)
                    figures.setdefault((transport, level), []).append(uvloop.run(run))
        process.kill()
    print("| transport | in flight | caller CPU us a message | server CPU us a message |")
    print("|---|---:|---:|---:|")
    for (transport, level), runs in sorted(figures.items(), key=lambda item: item[0][::-1]):
        caller = statistics.median(r[0] for r in runs)
        server = statistics.median(r[1] for r in runs)
        print(f"| {transport} | {level} | {caller:.1f} | {server:.1f} |")


if __name__ == "__main__":
    main()
