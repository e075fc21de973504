"""A sending process: its own asyncio loop and grpc.aio channels, one job at a time.

Messages are serialized once, before the run, and sent as bytes; answers are not decoded
beyond the v2 response parameters, so a request costs the client little more than gRPC's own
work. In an open loop each request is due at a fixed time and its latency runs from then, so
time spent queued anywhere — in the server, in the network, waiting for a free slot — counts.

The parent talks to a worker over a pipe: ("job", Job) -> ("ready", None) | ("error", text);
("go", start on the wall clock) -> ("done", Record); ("close", None) ends the process.
"""

from __future__ import annotations

import asyncio
import signal
import time
from array import array
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc

from bench.load.schedule import Job, Plan
from bench.load.transport import aio_channel
from strata.proto.inference import grpc_service_pb2 as v2

INFER = "/inference.GRPCInferenceService/ModelInfer"
MAX_MESSAGE = 64 * 1024 * 1024


def _go_name(code: grpc.StatusCode) -> str:
    """Go's name of a status code (codes.Code.String()), the one ghz reports."""
    special = {grpc.StatusCode.OK: "OK", grpc.StatusCode.CANCELLED: "Canceled"}
    return special.get(code) or "".join(part.capitalize() for part in code.name.split("_"))


GO_NAMES = {code.value[0]: _go_name(code) for code in grpc.StatusCode}


def go_error(code: grpc.StatusCode, details: str | None) -> str:
    """An error as ghz (Go's status package) prints it."""
    return f"rpc error: code = {GO_NAMES[code.value[0]]} desc = {details or ''}"


@dataclass
class Record:
    """Every request one worker sent in one run, as parallel arrays (times in ns)."""

    due: array = field(default_factory=lambda: array("q"))  # from the start; closed: sent
    lag: array = field(default_factory=lambda: array("q"))  # sent - due (client lateness)
    latency: array = field(default_factory=lambda: array("q"))  # open: from due; closed: sent
    code: array = field(default_factory=lambda: array("b"))  # gRPC status code number
    error: array = field(default_factory=lambda: array("i"))  # index into errors, -1: none
    flags: array = field(default_factory=lambda: array("b"))  # 1 degraded, 2 cached
    errors: list[str] = field(default_factory=list)
    error_index: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    end_reason: str = "normal"

    def add(
        self, due: float, lag: float, latency: float, code: int, error: str | None, flags: int
    ) -> None:
        self.due.append(int(due * 1e9))
        self.lag.append(int(lag * 1e9))
        self.latency.append(int(latency * 1e9))
        self.code.append(code)
        self.flags.append(flags)
        if error is None:
            self.error.append(-1)
            return
        index = self.error_index.get(error)
        if index is None:
            index = self.error_index[error] = len(self.errors)
            self.errors.append(error)
        self.error.append(index)


def main(index: int, conn: Connection, progress: Any, stop: Any) -> None:
    """Process entry: serve jobs from the parent until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    asyncio.run(_serve(index, conn, progress, stop))


async def _serve(index: int, conn: Connection, progress: Any, stop: Any) -> None:
    channels: dict[tuple, list[grpc.aio.Channel]] = {}
    try:
        while True:
            kind, payload = await asyncio.to_thread(conn.recv)
            if kind == "close":
                return
            job: Job = payload
            try:
                calls = await _connect(job, channels)
            except ConnectionError as exc:
                conn.send(("error", str(exc)))
                continue
            conn.send(("ready", None))
            kind, start_wall = await asyncio.to_thread(conn.recv)
            if kind != "go":
                continue
            record = await Runner(job, calls, index, progress, stop).run(start_wall)
            conn.send(("done", record))
    finally:
        for group in channels.values():
            for channel in group:
                await channel.close()


async def _connect(job: Job, cache: dict[tuple, list[grpc.aio.Channel]]) -> list:
    """Open (or reuse) this job's channels, each its own connection, and wait until ready."""
    plan = job.plan
    key = (plan.target, job.connections, plan.tls)
    if key not in cache:
        options = [
            ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]
        cache[key] = [aio_channel(plan.target, plan.tls, options) for _ in range(job.connections)]
    channels = cache[key]
    try:
        await asyncio.wait_for(
            asyncio.gather(*(c.channel_ready() for c in channels)), plan.connect_timeout
        )
    except TimeoutError:
        state = channels[0].get_state()
        for channel in cache.pop(key):
            await channel.close()
        failed = state is grpc.ChannelConnectivity.TRANSIENT_FAILURE
        why = "connection refused or unreachable" if failed else f"still {state.name}"
        raise ConnectionError(
            f"cannot connect to {plan.target} within {plan.connect_timeout:g}s ({why}); "
            "is the server running there?"
        ) from None
    return [c.unary_unary(plan.method) for c in channels]


class Runner:
    """One run of one job on this worker's event loop."""

    def __init__(self, job: Job, calls: list, index: int, progress: Any, stop: Any) -> None:
        self.job = job
        self.plan: Plan = job.plan
        self.calls = calls
        self.index = index
        self.progress = progress
        self.stop = stop
        self.record = Record()
        self.inspect = self.plan.inspect and self.plan.method == INFER
        self.loop = asyncio.get_running_loop()
        self.start = 0.0

    async def run(self, start_wall: float) -> Record:
        self.start = self.loop.time() + (start_wall - time.time())
        await asyncio.sleep(max(0.0, self.start - self.loop.time()))
        cpu = time.process_time()
        if self.plan.open_loop:
            await self._open_loop()
        else:
            await self._closed_loop()
        self.record.cpu_seconds = time.process_time() - cpu
        self.record.wall_seconds = self.loop.time() - self.start
        return self.record

    async def _open_loop(self) -> None:
        period = 1.0 / self.plan.rps
        cap = self.job.concurrency
        slots = asyncio.Semaphore(cap) if cap else None
        tasks: set[asyncio.Task] = set()
        for i in range(self.job.offset, self.job.count, self.job.stride):
            due = self.start + i * period
            delay = due - self.loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.stop.is_set():
                self.record.end_reason = "cancel"
                break
            lag = self.loop.time() - due
            task = self.loop.create_task(self._open_one(i, due, lag, slots))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if self.plan.duration is not None and self.record.end_reason == "normal":
            self.record.end_reason = "timeout"  # ghz's word for "ran for -z"
        await asyncio.gather(*list(tasks))

    async def _open_one(self, i: int, due: float, lag: float, slots) -> None:
        if slots is None:
            await self._call(i, due, lag)
            return
        async with slots:
            await self._call(i, due, lag)

    async def _closed_loop(self) -> None:
        end = self.start + self.plan.duration if self.plan.duration else None
        remaining = self.job.count
        sent = 0

        async def client() -> None:
            nonlocal remaining, sent
            while True:
                if self.stop.is_set():
                    self.record.end_reason = "cancel"
                    return
                if end is not None and self.loop.time() >= end:
                    self.record.end_reason = "timeout"
                    return
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                i = self.job.offset + sent * self.job.stride
                sent += 1
                await self._call(i, None, 0.0)

        await asyncio.gather(*(client() for _ in range(self.job.concurrency or 1)))

    async def _call(self, i: int, due: float | None, lag: float) -> None:
        plan = self.plan
        message = plan.requests[i % len(plan.requests)]
        call = self.calls[i % len(self.calls)]
        sent = self.loop.time()
        code, error, flags = 0, None, 0
        try:
            reply = await call(message, timeout=plan.timeout, metadata=plan.metadata or None)
            if self.inspect:
                flags = _flags(reply)
        except grpc.aio.AioRpcError as exc:
            code, error = exc.code().value[0], go_error(exc.code(), exc.details())
        done = self.loop.time()
        since = sent if due is None else due
        self.record.add(since - self.start, lag, done - since, code, error, flags)
        self.progress[self.index] += 1


def _flags(reply: bytes) -> int:
    """1 if the gateway marked the answer degraded, 2 if it came from its cache."""
    parameters = v2.ModelInferResponse.FromString(reply).parameters
    flags = 0
    if "strata.degraded" in parameters and parameters["strata.degraded"].bool_param:
        flags |= 1
    if "strata.cached" in parameters and parameters["strata.cached"].bool_param:
        flags |= 2
    return flags
