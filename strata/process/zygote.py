"""The zygote: one process that imports what every service shares, then forks the services.

Each service imports the same libraries as it starts (grpc, protobuf and the stubs, numpy,
pydantic and the config's models, OpenTelemetry, prometheus_client, yaml, uvloop): some
0.6 s of CPU and 40 MB of memory of its own, paid again by every process. The launcher
(strata.process.forked) starts this process once; it imports `PRELOAD`, freezes what that
made out of the collector's sight (gc.freeze: a collection in a child would otherwise write
to every object's header and copy its page), and forks each service on request. A child shares
those pages with the zygote and its siblings until it writes to them, and starts at the
service's own work.

gRPC is imported here, never initialised: gRPC starts threads and opens its polling engine on
the first channel or server, which a fork does not carry over, so each child makes its own
(gRPC supports fork without exec before any server or channel exists: its Python
multiprocessing example does the same; GRPC_ENABLE_FORK_SUPPORT is for forks after).
The zygote runs no thread of its own (it refuses to serve if a preloaded library started
one) and no event loop; it only waits on its socket and reaps its children.

Protocol, one JSON object a line on the socket the launcher passes (its fd is argv[1]): the
zygote says `{"ready": true}` or `{"refused": why}` once preloaded; then, per request
`{"module", "argv", "env", "cwd", "log", "name"}`, `{"pid": N}`; and for each child that ends,
`{"exited": pid, "code": c}` with the code Popen would give (negative: the signal). The zygote
ignores SIGINT and SIGTERM, so a Ctrl-C to the terminal's process group leaves it to report
how each child ended, and exits when the launcher closes the socket; its children run on.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

# What every layer imports as it starts (tests/unit/test_start_imports.py checks that each
# layer does): the serving stack, the codec and the stubs, the config and the model repository.
PRELOAD = (
    "strata.process.pydantic_plugins",
    "strata.process.transport",  # before grpc: it sets GRPC_EXPERIMENTS
    "strata.process.grpc_logs",  # and GRPC_VERBOSITY
    "strata.rpc.main",
    "strata.wire.stack",
    "strata.wire.v2meta",
    "strata.calls.streams",
    "strata.models.repository",
)
# numpy's OpenBLAS starts a thread per core as it loads; the services' matrices are small, so
# one thread (the caller's) serves them, and the zygote stays single-threaded. An operator's
# own setting wins (and, starting threads, turns the zygote off: see threads()).
SINGLE_THREADED = {"OPENBLAS_NUM_THREADS": "1"}
Message = dict[str, Any]
# A child's signal handling: Python's own, none of the zygote's.
DEFAULT_HANDLERS: dict[int, Callable[[int, FrameType | None], Any] | int] = {
    signal.SIGCHLD: signal.SIG_DFL,
    signal.SIGINT: signal.default_int_handler,
    signal.SIGTERM: signal.SIG_DFL,
}


def threads() -> int:
    """How many threads this process runs, C libraries' included where the system says."""
    with contextlib.suppress(OSError):
        return len(os.listdir("/proc/self/task"))
    return threading.active_count()


def preload() -> dict[str, str]:
    """Import PRELOAD and freeze it; the environment variables that the imports set, which
    each child keeps (they were read as the libraries loaded)."""
    before = dict(os.environ)
    for name, value in SINGLE_THREADED.items():
        os.environ.setdefault(name, value)
    for module in PRELOAD:
        importlib.import_module(module)
    gc.collect()
    gc.freeze()
    return {k: v for k, v in os.environ.items() if before.get(k) != v}


def send(sock: socket.socket, message: Message) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


class Zygote:
    """The serving loop: fork on request, report each child's end."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buffer = b""
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()

    def serve(self) -> Message | None:
        """Serve until the launcher hangs up (None), or, in a forked child, its request."""
        try:
            return self._serve()
        except (BrokenPipeError, ConnectionResetError):  # the launcher died
            return None

    def _serve(self) -> Message | None:
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self._selector.register(self.sock, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        while True:
            for key, _ in self._selector.select():
                if key.fileobj is not self.sock:
                    os.read(self._wake_r, 512)
                    self._reap()
                    continue
                received = self.sock.recv(65536)
                if not received:
                    return None
                self._buffer += received
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    if self._fork():
                        return json.loads(line)  # type: ignore[no-any-return]

    def _fork(self) -> bool:
        """Fork; in the parent, report the child's pid and return False."""
        pid = os.fork()
        if pid == 0:
            self._forget()
            return True
        send(self.sock, {"pid": pid})
        return False

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send(self.sock, {"exited": pid, "code": os.waitstatus_to_exitcode(status)})

    def _forget(self) -> None:
        """In a child: none of the zygote's signal handling, socket or pipes."""
        signal.set_wakeup_fd(-1)
        for sig, handler in DEFAULT_HANDLERS.items():
            signal.signal(sig, handler)
        self._selector.close()
        self.sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)


def become(request: Message, kept: dict[str, str]) -> None:
    """In a forked child: take on the service's name, environment, directory, output and
    arguments, and run its module as `python -m` would."""
    with contextlib.suppress(OSError):  # what ps and top show (Linux): 15 bytes at most
        Path("/proc/self/comm").write_text(request["name"][:15])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**kept, **request["env"]})
    if request["log"] is not None:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
    sys.argv = [request["module"], *request["argv"]]
    try:
        runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
    finally:
        # It has stopped: a signal now (the launcher's SIGTERM after a Ctrl-C reached the
        # whole group) would only cut the interpreter's exit short, a clean stop read as
        # death by SIGTERM; seen in 2 of 3 such stops of a forked deployment.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


def main() -> None:
    """`python -m strata.process.zygote FD`: preload, then serve the launcher on socket FD."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    kept = preload()
    running = threads()
    if running > 1:
        send(sock, {"refused": f"{running} threads after preloading; a fork keeps only one"})
        return
    send(sock, {"ready": True})
    sys.stdout.flush()
    sys.stderr.flush()
    request = Zygote(sock).serve()
    if request is not None:  # a child: it leaves the zygote's frames and runs its service
        become(request, kept)


if __name__ == "__main__":
    main()
