"""A sending process: its own asyncio loop and clients (gRPC or HTTP), one job at a time,
sent by Python or, for a plan whose sender is `compiled`, by the compiled sender it starts
(bench/load/native.py).

Requests are prepared once, before the run, and sent as bytes; answers are not decoded beyond
the v2 response parameters, so a request costs the client little more than its transport's own
work (bench/load/clients.py). In an open loop each request is due at a fixed time and its
latency runs from then, so time spent queued anywhere — in the server, in the network, waiting
for a free slot — counts.

The parent talks to a worker over a pipe: ("job", Job) -> ("ready", None) | ("error", text);
("go", start on the wall clock) -> ("done", Record); ("close", None) ends the process.
"""

from __future__ import annotations

import asyncio
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

from bench.load import native
from bench.load.clients import INFER, Client, Send, open_client
from bench.load.record import Record
from bench.load.schedule import Job, Plan


def main(index: int, conn: Connection, progress: Any, stop: Any) -> None:
    """Process entry: serve jobs from the parent until told to close."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    asyncio.run(_serve(index, conn, progress, stop))


async def _serve(index: int, conn: Connection, progress: Any, stop: Any) -> None:
    clients: dict[tuple, Client] = {}
    try:
        while True:
            kind, payload = await asyncio.to_thread(conn.recv)
            if kind == "close":
                return
            job: Job = payload
            try:
                runner = await _prepare(job, clients, index, progress, stop)
            except ConnectionError as exc:
                conn.send(("error", str(exc)))
                continue
            conn.send(("ready", None))
            kind, start_wall = await asyncio.to_thread(conn.recv)
            if kind != "go":
                await runner.abort()
                continue
            conn.send(("done", await runner.run(start_wall)))
    finally:
        for client in clients.values():
            await client.close()


async def _prepare(
    job: Job, clients: dict[tuple, Client], index: int, progress: Any, stop: Any
) -> Runner | native.CompiledRunner:
    """The job's runner, its connections up; ConnectionError if the target cannot be reached."""
    if job.plan.sender == "compiled":
        runner = native.CompiledRunner(job, index, progress, stop)
        await runner.prepare()
        return runner
    return Runner(job, await _connect(job, clients), index, progress, stop)


async def _connect(job: Job, cache: dict[tuple, Client]) -> list[Send]:
    """Open (or reuse) this job's connections, wait until the target answers, and say how
    its requests go out."""
    plan = job.plan
    key = (plan.target, job.connections, plan.tls)
    if key not in cache:
        cache[key] = open_client(plan, job.connections)
    try:
        await cache[key].ready(plan.connect_timeout)
    except ConnectionError:
        await cache.pop(key).close()
        raise
    # Only a v2 infer answer carries the gateway's parameters; an HTTP plan is always one.
    inspect = plan.inspect and (plan.http or plan.method == INFER)
    return cache[key].senders(plan, inspect)


class Runner:
    """One run of one job on this worker's event loop."""

    def __init__(self, job: Job, sends: list[Send], index: int, progress: Any, stop: Any) -> None:
        self.job = job
        self.plan: Plan = job.plan
        self.sends = sends
        self.index = index
        self.progress = progress
        self.stop = stop
        self.record = Record()
        self.loop = asyncio.get_running_loop()
        self.start = 0.0

    async def abort(self) -> None:
        """Nothing to undo: a Python run starts nothing before its go."""

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
        requests = self.plan.requests
        # By this worker's own count (i strides by the number of workers): every connection
        # takes its turn, not only those whose index shares i's residue.
        send = self.sends[i // self.job.stride % len(self.sends)]
        sent = self.loop.time()
        code, error, flags = await send(requests[i % len(requests)])
        done = self.loop.time()
        since = sent if due is None else due
        self.record.add(since - self.start, lag, done - since, code, error, flags)
        self.progress[self.index] += 1
