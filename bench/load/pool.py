"""The worker processes: started once, given one plan at a time, all starting together.

Workers are spawned, not forked, so no gRPC state of the parent leaks into them; as with
any spawned process, a script that makes a pool must guard its own top level with
`if __name__ == "__main__":`. Each worker keeps its channels between runs to the same target,
so a benchmark of many runs pays for start-up and connections once (the compiled sender,
bench/load/native.py, is a process of its own for each run, and connects before the run's
start).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection

from bench.load import native, worker
from bench.load.results import Results, merge
from bench.load.schedule import Plan, split

START_DELAY = 0.05  # seconds between "go" and the first send, so every worker starts at once
Progress = Callable[[int, float], None]  # (requests done, seconds since the start)


class ConnectFailed(ConnectionError):
    """A worker could not reach the target; the message says where and why."""


class LoadPool:
    """`workers` sending processes, for as long as the block lasts."""

    def __init__(self, workers: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.progress = context.Array("q", workers, lock=False)
        self.stop = context.Event()
        self.conns: list[Connection] = []
        self.processes = []
        for index in range(workers):
            parent, child = context.Pipe()
            process = context.Process(
                target=worker.main,
                args=(index, child, self.progress, self.stop),
                name=f"bench-load-{index}",
                daemon=True,
            )
            process.start()
            child.close()
            self.conns.append(parent)
            self.processes.append(process)

    @property
    def size(self) -> int:
        return len(self.processes)

    def __enter__(self) -> LoadPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError):  # the worker is already gone
                conn.send(("close", None))
        for process in self.processes:
            process.join(timeout=5)
            if process.is_alive():
                process.kill()
                process.join()
        self.conns.clear()
        self.processes.clear()

    def run(self, plan: Plan, on_progress: Progress | None = None) -> Results:
        """Send `plan` from every worker at once and wait for every answer.

        Ctrl-C stops sending; what was sent is still waited for and reported. The results'
        plan names the sender that sent it; ValueError if the plan's sender cannot.
        """
        plan = native.resolve(plan)
        jobs = split(plan, self.size)
        conns = self.conns[: len(jobs)]
        for conn, job in zip(conns, jobs, strict=True):
            conn.send(("job", job))
        self._await_ready(conns)
        for i in range(self.size):
            self.progress[i] = 0
        self.stop.clear()
        start_wall = time.time() + START_DELAY
        for conn in conns:
            conn.send(("go", start_wall))
        records = self._collect(conns, start_wall, on_progress)
        self.stop.clear()
        return merge(plan, start_wall, records)

    def _await_ready(self, conns: list[Connection]) -> None:
        replies = [self._receive(conn) for conn in conns]
        failures = [payload for kind, payload in replies if kind == "error"]
        if failures:
            for conn, (kind, _) in zip(conns, replies, strict=True):
                if kind == "ready":
                    conn.send(("abort", None))
            raise ConnectFailed(failures[0])

    def _collect(self, conns: list[Connection], start_wall: float, on_progress) -> list:
        pending = dict(enumerate(conns))
        records = {}
        while pending:
            try:
                for i, conn in list(pending.items()):
                    if conn.poll(0.1 / len(pending)):
                        records[i] = self._receive(conn)[1]
                        del pending[i]
                if on_progress is not None:
                    on_progress(sum(self.progress), time.time() - start_wall)
            except KeyboardInterrupt:
                self.stop.set()  # workers stop sending and drain what is in flight
        return [records[i] for i in sorted(records)]

    def _receive(self, conn: Connection) -> tuple[str, object]:
        index = self.conns.index(conn)
        while not conn.poll(0.5):
            if not self.processes[index].is_alive():
                code = self.processes[index].exitcode
                raise RuntimeError(f"load worker {index} died (exit code {code})")
        return conn.recv()
