"""CPU time of a server's processes, read from /proc/<pid>/stat (utime + stime).

A server is a set of named root processes; each root's descendants (MLServer's inference
workers, any helper a service forks) count too, named after their root. Reading before and
after a measured interval gives each process's CPU seconds over it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
PROC = Path("/proc")


def cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU seconds so far (None: it is gone)."""
    return _seconds(PROC / str(pid) / "stat")


def thread_seconds(pid: int, tid: int) -> float | None:
    """One thread's user + system CPU seconds so far (None: it is gone); a process's main
    thread has its process's id."""
    return _seconds(PROC / str(pid) / "task" / str(tid) / "stat")


def _seconds(path: Path) -> float | None:
    try:
        stat = path.read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # fields 14 and 15 of proc(5)


def children(pid: int) -> list[int]:
    """Every descendant of `pid`, parents before their children."""
    kids: dict[int, list[int]] = {}
    for child, parent in _parents():
        kids.setdefault(parent, []).append(child)
    found, queue = [], [pid]
    while queue:
        below = sorted(kids.get(queue.pop(0), []))
        found += below
        queue += below
    return found


def _parents() -> list[tuple[int, int]]:
    """(pid, parent pid) of every process (/proc/<pid>/stat field 4)."""
    pairs = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        pairs.append((int(entry.name), int(stat[stat.rindex(")") + 2 :].split()[1])))
    return pairs


def processes(roots: Mapping[str, int]) -> dict[str, int]:
    """Each root and its descendants by name: `gateway`, `mlserver`, `mlserver/1` ..."""
    named = {}
    for name, pid in roots.items():
        named[name] = pid
        for i, child in enumerate(children(pid), start=1):
            named[f"{name}/{i}"] = child
    return named


def snapshot(named: Mapping[str, int]) -> dict[str, float]:
    """CPU seconds so far of every process still running."""
    return {name: s for name, pid in named.items() if (s := cpu_seconds(pid)) is not None}


def spent(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """CPU seconds each process spent between two snapshots."""
    return {name: after[name] - before.get(name, 0.0) for name in after}
