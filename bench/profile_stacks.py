"""py-spy's raw stacks put in categories: gRPC, (de)serialising, the work, Strata, the loop.

py-spy's `--format raw` writes one line per distinct stack: its frames from the outermost
to the innermost, each `function (file:line)`, joined by `;`, then a space and how many
samples had it. A stack belongs to the category of the innermost frame that names one
(CATEGORIES, in the order given: the first pattern that a frame's file holds decides);
frames that name none (numpy, the standard library) are passed over, so that numpy under a
preprocess step counts as the work and numpy under the codec as (de)serialising. With
py-spy's `--native`, C frames name their library (grpc/_cython/cygrpc...so, uvloop's,
onnxruntime's), so gRPC's core and the loop's C parts are told apart; without it, what runs
in C under the loop with no Python frame of its own (gRPC's Cython core, uvloop) counts as
the loop.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

# (category, patterns any of which a frame's file or function may hold), tried in order.
CATEGORIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "work",
        (
            "onnxruntime",
            "PIL/",
            "tokenizers",
            "services/preprocess/steps/",
            "services/postprocess/rules/",
        ),
    ),
    ("(de)serialising", ("google/protobuf", "google/_upb", "_pb2.py", "strata/wire/codec.py")),
    ("gRPC", ("grpc/", "grpc_health", "grpc_reflection")),
    ("loop", ("asyncio/", "uvloop")),
    ("Strata", ("strata/", "services/")),
)
OTHER = "other"
# With --native, a thread waiting in the kernel is sampled too: its innermost frame is the
# wait (gRPC's pollers sit in epoll_wait, its timers and idle threads in futexes).
WAITS = frozenset(
    {
        "epoll_wait",
        "epoll_pwait",
        "poll",
        "ppoll",
        "select",
        "pselect",
        "syscall",
        "pthread_cond_wait",
        "pthread_cond_timedwait",
        "sem_wait",
        "sem_timedwait",
        "nanosleep",
        "clock_nanosleep",
    }
)
COLUMNS = [name for name, _ in CATEGORIES] + [OTHER]
_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def category(stack: str) -> str:
    """The category of one raw stack (without its count)."""
    for frame in reversed(stack.split(";")):
        match = _FRAME.match(frame.strip())
        where = match["file"] if match else frame
        for name, patterns in CATEGORIES:
            if any(pattern in where for pattern in patterns):
                return name
    return OTHER


def _waits(stack: str) -> bool:
    """Whether the innermost frame is a native wait (a thread idle in the kernel): a named
    one, or libc's unnamed internals, which are its syscall wrappers (what libc does on the
    CPU, memcpy and the like, has exported names)."""
    function, _, library = stack.rsplit(";", 1)[-1].partition(" (")
    return function in WAITS or (function.startswith("0x") and library.startswith("libc."))


@dataclass
class Profile:
    """One process's busy samples by category, and the innermost frames of those in none."""

    counts: Counter[str] = field(default_factory=Counter)
    unplaced: Counter[str] = field(default_factory=Counter)

    @classmethod
    def of(cls, raw: str) -> Profile:
        """The profile in one py-spy raw file."""
        profile = cls()
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            if not (stack and count.isdigit()) or _waits(stack):
                continue
            name = category(stack)
            profile.counts[name] += int(count)
            if name == OTHER:
                profile.unplaced[stack.rsplit(";", 1)[-1]] += int(count)
        return profile


def table(profiles: Mapping[str, Profile]) -> list[str]:
    """Markdown: each process's busy samples and the share of each category, then the
    commonest innermost frames of the samples in none (what `other` is)."""
    lines = [
        "| process | busy samples | " + " | ".join(COLUMNS) + " |",
        "|---|---:|" + "---:|" * len(COLUMNS),
    ]
    for process, profile in profiles.items():
        total = profile.counts.total()
        cells = [f"{100 * profile.counts[c] / total:.0f}%" if total else "-" for c in COLUMNS]
        lines.append(f"| {process} | {total} | " + " | ".join(cells) + " |")
    lines += ["", "The commonest innermost frames of `other`, by process:", ""]
    for process, profile in profiles.items():
        frames = ", ".join(f"`{frame}` {n}" for frame, n in profile.unplaced.most_common(3))
        lines.append(f"- {process}: {frames or 'none'}")
    return lines
