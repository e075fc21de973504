"""The launcher's side of the zygote (strata.process.zygote): services started as its forks.

`Zygote.fork` asks the zygote for a service process and hands back a `Forked`, which answers
as subprocess.Popen does (pid, returncode, poll, wait, send_signal, kill), so a supervisor
holds forked and exec'd processes alike. The zygote is the children's parent, so it reaps
them and reports each one's exit code here.

STRATA_FORK=0 in the launcher's environment turns forking off: each service is then started
with its own interpreter (`python -m services.<layer>`), as on a platform without fork.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

log = logging.getLogger(__name__)

SWITCH = "STRATA_FORK"  # "0": start every service with its own interpreter
# The code of a child whose zygote died before it: no one can say how it ended.
UNKNOWN = 255


def enabled(env: dict[str, str]) -> bool:
    """Whether services started with `env` are forked from a zygote."""
    return hasattr(os, "fork") and env.get(SWITCH, "1") != "0"


class Child(Protocol):
    """A service process, forked or exec'd: the part of subprocess.Popen a supervisor uses."""

    @property
    def pid(self) -> int: ...
    @property
    def returncode(self) -> int | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def send_signal(self, sig: int) -> None: ...
    def kill(self) -> None: ...


@dataclass(frozen=True)
class Start:
    """A service process to start: `module` run as `python -m` would, with `argv` and `env`,
    its stdout and stderr appended to `log` (None: the starter's own), known as `name`."""

    name: str
    module: str
    argv: list[str]
    env: dict[str, str]
    log: Path | None


class ZygoteRefused(RuntimeError):
    """The zygote could not start or serve; the caller starts its services another way."""


class Zygote:
    """One zygote process, started with `env` in `cwd`, and the children it forked."""

    def __init__(self, env: dict[str, str], cwd: Path, timeout: float = 60.0) -> None:
        self.env = env
        self._sock, theirs = socket.socketpair()
        command = [sys.executable, "-m", "strata.process.zygote", str(theirs.fileno())]
        self.process = subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, pass_fds=(theirs.fileno(),)
        )
        theirs.close()
        self.cwd = cwd
        self._buffer = b""
        self._lock = threading.Lock()  # the socket's reader
        self._forking = threading.Lock()  # one request and its reply at a time
        self._poll = select.poll()
        self._poll.register(self._sock, select.POLLIN)
        self._codes: dict[int, int] = {}  # children that ended, not yet asked about
        self._running: set[int] = set()
        self._replies: list[dict[str, Any]] = []
        self.gone = False
        try:
            ready = self._reply(timeout)
            if "refused" in ready:
                raise ZygoteRefused(ready["refused"])
        except ZygoteRefused:
            self.close()
            raise

    def fork(self, start: Start) -> Forked:
        """A new process for `start`, forked from the zygote."""
        request = {
            **asdict(start),
            "cwd": str(self.cwd),
            "log": None if start.log is None else str(start.log),
        }
        with self._forking:
            with self._lock:
                self._sock.sendall(json.dumps(request).encode() + b"\n")
            pid: int = self._reply(60.0)["pid"]
        self._running.add(pid)
        return Forked(pid, self)

    def code(self, pid: int, timeout: float = 0.0) -> int | None:
        """Child `pid`'s exit code, once (None: it runs), waiting up to `timeout` seconds
        for news from the zygote."""
        self.collect(timeout)
        code = self._codes.pop(pid, None)
        if code is not None:
            self._running.discard(pid)
        return code

    def _reply(self, timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while not self._replies:
            if self.gone or time.monotonic() > end:
                raise ZygoteRefused("the zygote did not answer")
            self.collect(max(0.0, end - time.monotonic()))
        return self._replies.pop(0)

    def collect(self, timeout: float) -> None:
        """Read what the zygote said within `timeout` seconds: replies and exit codes."""
        with self._lock:
            if self.gone:
                self._orphans_ended()
                return
            if not self._poll.poll(timeout * 1000):
                return
            received = self._sock.recv(65536)
            if not received:
                self.gone = True
                log.error(
                    "the zygote (pid %d) died; how its services end is lost", self.process.pid
                )
                return
            self._buffer += received
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                message = json.loads(line)
                if "exited" in message:
                    self._codes[message["exited"]] = message["code"]
                else:
                    self._replies.append(message)

    def _orphans_ended(self) -> None:
        """With the zygote dead, its children (reparented) run on: one that is gone has
        ended, with a code no one can read."""
        for pid in self._running - set(self._codes):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                self._codes[pid] = UNKNOWN

    def close(self) -> None:
        """Hang up: the zygote exits; children it forked run on, as orphans (their codes
        are lost: see _orphans_ended)."""
        with self._lock:
            self.gone = True
            self._sock.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # still importing, say, on a crowded machine
            self.process.kill()
            self.process.wait()


class Forked:
    """A process the zygote forked, with subprocess.Popen's interface."""

    def __init__(self, pid: int, zygote: Zygote) -> None:
        self.pid = pid
        self.zygote = zygote
        self.returncode: int | None = None

    def poll(self) -> int | None:
        return self._poll(0.0)

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        while (
            code := self._poll(0.2 if end is None else min(0.2, end - time.monotonic()))
        ) is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def _poll(self, timeout: float) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.code(self.pid, max(0.0, timeout))
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # once reaped, its pid may be another process's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
