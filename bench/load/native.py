"""The compiled sender: one worker's job sent by a small C++ program (bench/load/sender/),
where it is built.

grpc's Python layer costs the client about 0.2 ms of CPU per call; on a machine whose cores the
load tool shares with the server it measures, that is a core at a few thousand calls a second,
taken from the server. `make load-sender` builds build/load-sender from source (it needs
Debian's libgrpc++-dev); a plain-text gRPC run then goes through it, and anything else (HTTP,
TLS, or no build) through the Python sender. Which one sent a run is in its plan
(`Results.plan.sender`) and its report.

The worker stays the parent's contact: it hands the program its job as files, starts it, says
go, relays its progress and the pool's stop, and reads its calls back into the same Record the
Python sender fills.
"""

from __future__ import annotations

import asyncio
import struct
import tempfile
import time
from array import array
from dataclasses import replace
from pathlib import Path
from typing import Any

import grpc

from bench.load import codes
from bench.load.clients import INFER, unreachable
from bench.load.options import SENDERS
from bench.load.record import Record
from bench.load.schedule import Job, Plan

BINARY = Path(__file__).resolve().parents[2] / "build" / "load-sender"
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


def why_not(plan: Plan) -> str | None:
    """Why the compiled sender cannot send `plan` (None: it can)."""
    if plan.http:
        return "it speaks gRPC only, and the target is HTTP"
    if plan.tls is not None:
        return "it sends plaintext only, and the run asks for TLS"
    if not BINARY.is_file():
        return f"{BINARY} is not built (make load-sender)"
    return None


def resolve(plan: Plan) -> Plan:
    """The plan with the sender that will send it: `auto` becomes `compiled` where it can,
    else `python`. ValueError if `compiled` was asked for and cannot be used."""
    if plan.sender not in SENDERS:
        raise ValueError(f"unknown sender {plan.sender!r}; one of {', '.join(SENDERS)}")
    if plan.sender == "python":
        return plan
    reason = why_not(plan)
    if reason is None:
        return replace(plan, sender="compiled")
    if plan.sender == "compiled":
        raise ValueError(f"the compiled sender cannot send this run: {reason}")
    return replace(plan, sender="python")


def described(plan: Plan) -> str:
    """Which sender sends `plan`, and for Python, why not the compiled one: a line for a
    benchmark's output."""
    resolved = resolve(plan)
    if resolved.sender == "compiled":
        return f"the load tool sends through its compiled sender ({BINARY.name})"
    reason = why_not(plan) if plan.sender == "auto" else "--sender python"
    return f"the load tool sends through Python ({reason})"


class CompiledRunner:
    """One job sent by the compiled sender, from a worker's event loop."""

    def __init__(self, job: Job, index: int, progress: Any, stop: Any) -> None:
        self.job = job
        self.index = index
        self.progress = progress
        self.stop = stop
        self.folder = tempfile.TemporaryDirectory(prefix="bench-load-")
        self.process: asyncio.subprocess.Process | None = None

    async def prepare(self) -> None:
        """Start the program; return once its connections are up, else ConnectionError."""
        folder = Path(self.folder.name)
        (folder / "job").write_text(job_text(self.job))
        (folder / "requests").write_bytes(
            b"".join(struct.pack("<I", len(m)) + m for m in self.job.plan.requests)
        )
        with open(folder / "stderr", "wb") as stderr:
            self.process = await asyncio.create_subprocess_exec(
                str(BINARY),
                str(folder / "job"),
                str(folder / "requests"),
                str(folder / "calls"),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
        word, rest = await self._line()
        if word == "ready":
            return
        output = self._stderr()
        await self.abort()
        if word != "error":  # it never got as far as connecting
            raise RuntimeError(f"the compiled sender failed to start: {output}")
        plan = self.job.plan
        raise unreachable(plan.target, plan.connect_timeout, rest)

    async def run(self, start_wall: float) -> Record:
        """Say go, relay progress and stop until the program is done; its calls."""
        cpu = time.process_time()
        await self._say(f"go {start_wall!r}")
        stopping = False
        while True:
            word, rest = await self._line()
            if word == "done":
                break
            if word != "progress":
                raise RuntimeError(f"the compiled sender failed: {self._stderr()}")
            self.progress[self.index] = int(rest)
            if self.stop.is_set() and not stopping:
                stopping = True
                await self._say("stop")
        await self.process.wait()
        record = read_record((Path(self.folder.name) / "calls").read_bytes())
        record.cpu_seconds += time.process_time() - cpu
        self.folder.cleanup()
        return record

    async def abort(self) -> None:
        """End the program without a run (its input closed), and remove its files."""
        if self.process is not None and self.process.returncode is None:
            self.process.stdin.close()
            await self.process.wait()
        self.folder.cleanup()

    async def _line(self) -> tuple[str, str]:
        line = (await self.process.stdout.readline()).decode().strip()
        word, _, rest = line.partition(" ")
        return word, rest

    async def _say(self, line: str) -> None:
        self.process.stdin.write(line.encode() + b"\n")
        await self.process.stdin.drain()

    def _stderr(self) -> str:
        path = Path(self.folder.name) / "stderr"
        return path.read_text(errors="replace").strip()[-2000:] or "no message"


def job_text(job: Job) -> str:
    """The job as the program reads it: `key value` lines."""
    plan = job.plan
    lines = {
        "target": plan.target,
        "method": plan.method,
        "timeout": plan.timeout or 0,
        "connect_timeout": plan.connect_timeout,
        "connections": job.connections,
        "rps": plan.rps or 0,
        "duration": plan.duration or 0,
        "count": -1 if job.count is None else job.count,
        "offset": job.offset,
        "stride": job.stride,
        "concurrency": job.concurrency or 0,
        # Only a v2 infer answer carries the gateway's parameters.
        "inspect": int(plan.inspect and plan.method == INFER),
    }
    text = "".join(
        f"{key} {value!r}\n" if isinstance(value, float) else f"{key} {value}\n"
        for key, value in lines.items()
    )
    return text + "".join(f"metadata {k}\t{v}\n" for k, v in plan.metadata)


def read_record(data: bytes) -> Record:
    """The program's calls (its layout: write_out in sender.cc) as a worker's Record."""
    view = memoryview(data)
    (n,) = struct.unpack_from("<q", view)
    at = 8
    record = Record()
    for name, kind in (
        ("due", "q"),
        ("lag", "q"),
        ("latency", "q"),
        ("code", "b"),
        ("flags", "b"),
        ("error", "i"),
    ):
        size = n * array(kind).itemsize
        getattr(record, name).frombytes(view[at : at + size])
        at += size
    (m,) = struct.unpack_from("<i", view, at)
    at += 4
    for _ in range(m):
        code, length = struct.unpack_from("<ii", view, at)
        at += 8
        details = bytes(view[at : at + length]).decode(errors="replace")
        at += length
        record.errors.append(codes.go_error(_STATUS[code], details))
    record.cpu_seconds, record.wall_seconds, length = struct.unpack_from("<ddi", view, at)
    at += 20
    record.end_reason = bytes(view[at : at + length]).decode()
    return record
