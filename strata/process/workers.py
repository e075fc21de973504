"""Several processes of one service sharing its public ports (`gateway.processes`).

Python runs one thread of Python at a time, so one gateway process uses about one core. With
`processes: N` the command started (`python -m services.gateway`, by the launcher, compose or
Kubernetes alike) becomes a small parent: it claims the ports, then starts N workers, each
the same command with the same arguments, each with its own event loop, door, flights and
state. (The parent, not the launcher, starts them: compose and Kubernetes run the gateway
without the launcher, and the claim below must be held by something that outlives a
worker.) Each worker binds the gRPC, REST, admin and probe ports with SO_REUSEPORT, so the
kernel hands each new connection to one of them; a connection, and every call on it, stays
with the worker that accepted it.

SO_REUSEPORT would also let a second copy of Strata share the ports silently. So before any
worker starts, the parent claims each port with an abstract Unix socket named after it: a
name the kernel keeps per network namespace, the same scope as the port itself, and frees
when its holder dies. A second copy finds the name taken and exits with the one line and
code of any address in use (strata.process.exits); something else listening there is found, as
before, by binding the port once.

The parent serves the metrics port itself: workers write their metrics to files in a folder
of the parent's (prometheus_client's multi-process mode) and the parent's page sums them;
/readyz is 200 while any worker says SERVING. It restarts a worker that dies (a crash, a
kill) after a backoff, and stops every worker (SIGTERM: each drains) when it is told to
stop or when a worker exits for a reason no restart fixes (whose code it then exits with).
SIGHUP to the parent (which a worker sends after an admin Reload) makes every worker re-read
the config file.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from prometheus_client import multiprocess

from strata.process.exits import PERMANENT, AddressUnusable, bind_problem
from strata.telemetry.metrics import serve_workers_metrics

log = logging.getLogger(__name__)

WORKER = "STRATA_WORKER"  # set in a worker's environment: its index among the processes
LISTENING = "STRATA_WORKER_PIPE"  # the pipe a worker writes to once it listens
MULTIPROCESS = "PROMETHEUS_MULTIPROC_DIR"  # prometheus_client's multi-process folder
IN_USE = "already in use"
PR_SET_PDEATHSIG = 1  # prctl(2): the signal a child gets when its parent dies


def worker_index() -> int | None:
    """This process's index among its service's workers; None when it runs alone."""
    index = os.environ.get(WORKER)
    return None if index is None else int(index)


def sharing() -> bool:
    """Whether this process shares its public ports with sibling workers (SO_REUSEPORT)."""
    return worker_index() is not None


async def all_listening() -> None:
    """In a worker whose ports are open: tell the parent, and return once every sibling's
    are (the parent's SIGUSR1). Until then its health says NOT_SERVING, so no one is told to
    connect while the kernel has fewer than all the workers to hand connections to: a
    connection made then would stay on the first worker for good."""
    loop = asyncio.get_running_loop()
    everyone = asyncio.Event()
    # Left installed: SIGUSR1's default would end the process, should one come again.
    loop.add_signal_handler(signal.SIGUSR1, everyone.set)
    os.write(int(os.environ[LISTENING]), b"+")
    await everyone.wait()


def tell_siblings() -> None:
    """In a worker that re-read its config: have its parent tell every worker to re-read it
    (SIGHUP), so they all serve the same file. Nothing in a process that runs alone."""
    if sharing():
        os.kill(os.getppid(), signal.SIGHUP)


def claim(address: str, role: str) -> socket.socket:
    """The claim on `address` (host:port) for this deployment, held while the socket is open;
    AddressUnusable when another copy holds it or another program listens there. The claim
    names the port alone: another copy on the same port at another of the host's addresses
    (0.0.0.0 against 127.0.0.1) would share its connections as well."""
    name = f"\0strata:port:{address.rpartition(':')[2]}".encode()
    holder = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        holder.bind(name)
    except OSError:
        holder.close()
        raise AddressUnusable(address, role, IN_USE) from None
    problem = bind_problem(address)
    if problem:
        holder.close()
        raise AddressUnusable(address, role, problem)
    return holder


def reuse_port_socket(address: str) -> socket.socket:
    """A listening TCP socket on `address` that sibling workers share (SO_REUSEPORT)."""
    host, _, port = address.rpartition(":")
    family, kind, proto, _, where = socket.getaddrinfo(
        host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(where)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


@dataclass(frozen=True)
class Shared:
    """What the workers share: the ports, by role (`listen`, `REST`, `admin`), and the
    metrics page the parent serves (None: none)."""

    ports: dict[str, str]
    metrics: str | None


def _die_with_parent() -> None:
    """In a worker, before it runs: SIGTERM (a drain) when the parent dies, even by SIGKILL,
    so no worker outlives it holding the ports."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


class Parent:
    """Starts, restarts and stops the `count` workers of one service."""

    def __init__(self, name: str, count: int, shared: Shared, grace: float) -> None:
        self.name, self.count, self.shared, self.grace = name, count, shared, grace
        self.workers: dict[int, subprocess.Popen[bytes]] = {}
        self._pipes: dict[int, int] = {}  # each starting worker's pipe (read end)
        self._listening: set[int] = set()  # workers that listen, not yet told to serve
        self._open = False  # every worker has listened once: a new one may serve at once
        self._folder = tempfile.TemporaryDirectory(prefix=f"strata-{name}-metrics-")
        self._stop = threading.Event()
        self._reload = threading.Event()
        self._started: dict[int, float] = {}
        self._restart_at: dict[int, float] = {}
        self._delay: dict[int, float] = {}
        self.code = 0

    def run(self, argv: Sequence[str]) -> int:
        """Claim the ports, serve metrics, start the workers and tend them until told to
        stop; the exit code (a worker's permanent one, else 0)."""
        claims = [claim(address, role) for role, address in self.shared.ports.items()]
        try:
            self._serve_metrics()
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, lambda *_: self._stop.set())
            signal.signal(signal.SIGHUP, lambda *_: self._reload.set())
            for index in range(self.count):
                self._spawn(index, argv)
            while not self._stop.wait(0.1):
                self._tend(argv)
            self._stop_all()
        finally:
            for holder in claims:
                holder.close()
            self._folder.cleanup()
        return self.code

    def _serve_metrics(self) -> None:
        if self.shared.metrics is None:
            return
        try:
            serve_workers_metrics(self.shared.metrics, self._folder.name)
        except OSError as exc:
            raise AddressUnusable(self.shared.metrics, "metrics", IN_USE) from exc

    def _spawn(self, index: int, argv: Sequence[str]) -> None:
        read, write = os.pipe()
        os.set_blocking(read, False)
        env = {**os.environ, WORKER: str(index), MULTIPROCESS: self._folder.name}
        env[LISTENING] = str(write)
        command = [sys.executable, "-m", f"services.{self.name}", *argv]
        self.workers[index] = subprocess.Popen(
            command, env=env, pass_fds=(write,), preexec_fn=_die_with_parent
        )
        os.close(write)
        self._pipes[index] = read
        self._started[index] = time.monotonic()
        log.info("%s worker %d started (pid %d)", self.name, index, self.workers[index].pid)

    def _tend(self, argv: Sequence[str]) -> None:
        if self._reload.is_set():
            self._reload.clear()
            for process in self.workers.values():
                if process.poll() is None:
                    process.send_signal(signal.SIGHUP)
        now = time.monotonic()
        for index, process in list(self.workers.items()):
            code = process.poll()
            if code is None or index in self._restart_at:
                continue
            # Drop its live gauges (readiness) from the summed page.
            multiprocess.mark_process_dead(process.pid, self._folder.name)
            self._listening.discard(index)
            if code in PERMANENT:  # it said why in one line; no restart can fix it
                self.code = code
                self._stop.set()
                return
            ran = now - self._started[index]
            delay = 0.5 if ran > 60 else min(30.0, 2 * self._delay.get(index, 0.25))
            self._delay[index] = delay
            self._restart_at[index] = now + delay
            log.warning(
                "%s worker %d (pid %d) exited with %d after %.1f s; restarting it in %.1f s",
                *(self.name, index, process.pid, code, ran, delay),
            )
        for index, due in list(self._restart_at.items()):
            if due <= now:
                del self._restart_at[index]
                self._spawn(index, argv)
        self._let_serve()

    def _let_serve(self) -> None:
        """SIGUSR1 to each worker that listens: at start once all do, later at once."""
        for index, pipe in list(self._pipes.items()):
            try:
                said = os.read(pipe, 1)
            except BlockingIOError:
                continue
            os.close(pipe)
            del self._pipes[index]
            if said:  # else it died first; its restart gets a pipe of its own
                self._listening.add(index)
        if self._open or len(self._listening) == self.count:
            self._open = True
            for index in self._listening:
                if self.workers[index].poll() is None:
                    self.workers[index].send_signal(signal.SIGUSR1)
            self._listening.clear()

    def _stop_all(self) -> None:
        """SIGTERM every worker (each drains within its grace), then wait; kill stragglers."""
        running = [p for p in self.workers.values() if p.poll() is None]
        for process in running:
            process.send_signal(signal.SIGTERM)
        end = time.monotonic() + self.grace + 10
        for process in running:
            try:
                process.wait(timeout=max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
