"""Why a process cannot start, each reason with an exit code of its own.

A service that cannot start prints one line on stderr, `<process>: <what and where>`, and
exits with its reason's code (docs/troubleshooting.md lists them), with no traceback. The
codes are sysexits.h's where one fits. None of these reasons goes away by starting again, so
the launcher does not restart a process that exits with one of them.
"""

from __future__ import annotations

import errno
import socket
from typing import ClassVar

USAGE = 2  # argparse's own: the command line is wrong


class StartFailure(Exception):
    """A reason the process cannot start; its message says what and where, in one line."""

    code: ClassVar[int]
    meaning: ClassVar[str]


class ModelUnusable(StartFailure):
    """A model, pipeline, step or rule the config names cannot be loaded or built."""

    code = 65  # EX_DATAERR
    meaning = "a model, pipeline, step or rule cannot be loaded"


class FileUnreadable(StartFailure, OSError):
    """A file it needs (a certificate or key) is missing or unreadable."""

    code = 66  # EX_NOINPUT
    meaning = "a certificate or key is missing or unreadable"


class AddressUnusable(StartFailure, OSError):
    """An address it must listen on cannot be bound (in use, not this host's, not allowed)."""

    code = 69  # EX_UNAVAILABLE
    meaning = "an address it must listen on is in use or cannot be bound"

    def __init__(self, address: str, role: str, reason: str | None = None) -> None:
        self.reason = reason or bind_problem(address) or "cannot be bound"
        super().__init__(f"{address} ({role}) {self.reason}")


class ConfigInvalid(StartFailure):
    """The config file is missing, unreadable or invalid."""

    code = 78  # EX_CONFIG
    meaning = "the config is missing, unreadable or invalid"


FAILURES = (ModelUnusable, FileUnreadable, AddressUnusable, ConfigInvalid)
# Exit codes that another start cannot change: the launcher leaves such a process down.
PERMANENT = {USAGE: "its command line is wrong"} | {f.code: f.meaning for f in FAILURES}


def one_line(text: str) -> str:
    """A message of several lines (a heading, then one per problem) as one line."""
    heading, *problems = text.splitlines() or ["(no message)"]
    return " ".join([heading, "; ".join(p.strip() for p in problems)]).strip()


def refusal(exc: OSError) -> str:
    """How a failed bind reads after the address: `already in use`, or the system's words."""
    if exc.errno == errno.EADDRINUSE:
        return "already in use"
    return f"cannot be bound: {exc.strerror or exc}"


def bind_problem(address: str) -> str | None:
    """Why `address` (host:port) cannot be bound now, found by binding it (None: it can),
    for servers that do not say why (gRPC only says it failed)."""
    host, _, port = address.rpartition(":")
    try:
        found = socket.getaddrinfo(
            host.strip("[]") or None, int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except (socket.gaierror, ValueError) as exc:
        return f"cannot be bound: {exc}"
    family, kind, proto, _, where = found[0]
    with socket.socket(family, kind, proto) as attempt:
        attempt.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            attempt.bind(where)
        except OSError as exc:
            return refusal(exc)
    return None
