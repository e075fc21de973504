"""A request's deadline: one moment on one clock, from the gateway's door to the batcher.

Every deadline in Strata is a `Deadline`, a moment on `time.monotonic()`. It is made once
where a request comes in, from the caller's gRPC deadline (`within(context.time_remaining())`)
or its REST timeout header, else the gateway's default (`after`); from there the same value
goes with the request: through admission, the flight and each hop, to the inference batcher.

Between services it travels one way for a call and one way for a flight member:
- a call carries its deadline as gRPC's, the time `left()` when it is sent (a message on a
  lane, which has no gRPC deadline of its own, carries the same in v2's `timeout` parameter,
  as any v2 client may);
- each member of a flight carries its own in `strata.timeouts_us` (strata/wire/flight.py), the
  microseconds it has left when the flight is sent (`to_us`, `from_us`); a plain v2 server
  ignores that parameter and keeps the call's gRPC deadline, the latest of its members'.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from operator import attrgetter

from strata.errors import DeadlineExceeded


@dataclass(frozen=True, slots=True, order=True)
class Deadline:
    """The moment, on `time.monotonic()`, after which no one waits for the work."""

    at: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        """`seconds` from now."""
        return cls(time.monotonic() + seconds)

    @classmethod
    def within(cls, seconds: float | None) -> Deadline | None:
        """A call's deadline from its time remaining (gRPC's `context.time_remaining()`);
        None where the caller set none."""
        return None if seconds is None else cls(time.monotonic() + seconds)

    @classmethod
    def from_us(cls, microseconds: int) -> Deadline | None:
        """A flight member's deadline from its wire field; 0: none of its own."""
        return cls(time.monotonic() + microseconds / 1e6) if microseconds else None

    def to_us(self) -> int:
        """What is left, in whole microseconds for the wire: at least 1 (0 would mean none)."""
        return max(1, int(self.left() * 1e6))

    def left(self) -> float:
        """Seconds until the deadline; negative once it has passed."""
        return self.at - time.monotonic()

    def expired(self) -> bool:
        return time.monotonic() >= self.at

    def remaining(self, before: str) -> float:
        """Seconds left; DEADLINE_EXCEEDED, naming what it came `before`, once none are."""
        left = self.at - time.monotonic()
        if left <= 0:
            raise DeadlineExceeded(f"deadline passed before {before}")
        return left


def earliest(first: Deadline | None, second: Deadline | None) -> Deadline | None:
    """The sooner of two deadlines (`first` where they are equal); None where neither is set."""
    if first is None:
        return second
    if second is None or first.at <= second.at:
        return first
    return second


def latest(deadlines: Iterable[Deadline]) -> Deadline:
    """The last of several deadlines: how long a call made for all of them may take."""
    return max(deadlines, key=_AT)


_AT = attrgetter("at")
