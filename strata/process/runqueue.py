"""How long a thread has waited for a CPU while it could run: Linux's schedstat.

A machine short of cores delays every thread that wakes, and a measurement timed across
wake-ups (the door's probe: services/gateway/door/probe.py) reads that delay as if it were
its own. `/proc/thread-self/schedstat`'s second field is the time the thread spent runnable
on a run queue, not running, since it started: exactly that delay, counted by the kernel.
"""

from __future__ import annotations

import os

SCHEDSTAT = "/proc/thread-self/schedstat"


class RunQueue:
    """Seconds the thread that first calls it has waited on a run queue since it started;
    None where the kernel does not say (not Linux, schedstats off)."""

    def __init__(self, path: str = SCHEDSTAT) -> None:
        self._path = path
        self._fd: int | None = None
        self._absent = False

    def __call__(self) -> float | None:
        if self._absent:
            return None
        try:
            if self._fd is None:
                # Opened by the calling thread: /proc/thread-self names it at the open.
                self._fd = os.open(self._path, os.O_RDONLY)
            return int(os.pread(self._fd, 128, 0).split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            self._absent = True
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
