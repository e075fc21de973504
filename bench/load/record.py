"""What one worker sent in one run, whichever sender sent it."""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field


@dataclass
class Record:
    """Every request one worker sent in one run, as parallel arrays (times in ns)."""

    due: array = field(default_factory=lambda: array("q"))  # from the start; closed: sent
    lag: array = field(default_factory=lambda: array("q"))  # sent - due (client lateness)
    latency: array = field(default_factory=lambda: array("q"))  # open: from due; closed: sent
    code: array = field(default_factory=lambda: array("b"))  # gRPC status code number
    error: array = field(default_factory=lambda: array("i"))  # index into errors, -1: none
    flags: array = field(default_factory=lambda: array("b"))  # 1 degraded, 2 cached
    errors: list[str] = field(default_factory=list)
    error_index: dict[str, int] = field(default_factory=dict)
    cpu_seconds: float = 0.0
    wall_seconds: float = 0.0
    end_reason: str = "normal"

    def add(
        self, due: float, lag: float, latency: float, code: int, error: str | None, flags: int
    ) -> None:
        self.due.append(int(due * 1e9))
        self.lag.append(int(lag * 1e9))
        self.latency.append(int(latency * 1e9))
        self.code.append(code)
        self.flags.append(flags)
        if error is None:
            self.error.append(-1)
            return
        index = self.error_index.get(error)
        if index is None:
            index = self.error_index[error] = len(self.errors)
            self.errors.append(error)
        self.error.append(index)
