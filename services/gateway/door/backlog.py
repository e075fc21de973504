"""The wait before the door as it stands, and the door refusing on arrival while it is longer
than a pipeline's objective can afford.

Past capacity, calls wait in gRPC's own queue before any handler runs (probe.py); a call that
reaches its handler after waiting most of its pipeline's objective cannot be answered in time,
and answering it costs the CPU that the calls behind it needed to be on time, so every later
call is late too (goodput fell to a tenth of capacity at 1.5x). So a call whose caller set a
deadline is refused on arrival (RESOURCE_EXHAUSTED, reason `backlog`, a retry hint of the
wait) while calls wait before the door so long that, with the chain's recent median added
(at most half the objective), they miss `backlog_share` of the objective: before its inputs
are read or it takes a place, where a refusal costs about half an answer (docs/gateway.md,
Admission). Only the late are refused: refusing every call while the wait stood above half
the objective refused three in four at 2x and halved the answers, since the queue before the
door drains at the rate the event loop accepts calls, which a cheaper call raises only by
what it saves. A caller without a deadline (a closed loop with a client library's defaults)
is never refused here: it sends again at once, and its own concurrency bounds it.

The wait is the gateway's own measurement, never a client's deadline: the last probe's time,
or the time the probe in flight has waited so far where that is longer (a queue building up
shows before the probe comes back), less the event loop's lag, which a stall of the whole
machine adds to every probe without any call waiting before the door.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.gateway.door.concurrency import AdaptiveLimits
from services.gateway.door.policy import Checkpoint, Entry, Ticket
from strata.config.settings import Settings

# The shortest retry hint: the queue has not drained until a probe has passed it.
MIN_RETRY_SECONDS = 0.01


class Backlog:
    """The wait before the door now, from the probe's sends and answers (probe.py);
    `lag` is the event loop's latest lag, seconds."""

    def __init__(self, lag: Callable[[], float], clock: Callable[[], float] = time.monotonic):
        self.last = 0.0  # the last probe's wait, less the loop's lag, seconds
        self._sent: float | None = None  # when the probe in flight was sent
        self._lag = lag
        self._clock = clock

    def sent(self) -> None:
        self._sent = self._clock()

    def answered(self, seconds: float) -> float:
        """The probe in flight was answered after `seconds`: that wait less the loop's lag."""
        self._sent = None
        self.last = max(0.0, seconds - self._lag())
        return self.last

    def lost(self) -> None:
        """The probe in flight never reached the server (not yet, or no longer, up)."""
        self._sent = None

    def wait(self) -> float:
        """Seconds a call that reaches its handler now waited before the door, about."""
        if self._sent is None:
            return self.last
        return max(self.last, self._clock() - self._sent - self._lag())


class BacklogLimit:
    """Refuses on arrival a call with a deadline while the wait before the door and the
    chain's recent median together are longer than `backlog_share` of its objective."""

    checkpoint = Checkpoint.ARRIVAL

    def __init__(
        self, backlog: Backlog, limits: AdaptiveLimits, arrived: Callable[[str], None]
    ) -> None:
        self.backlog = backlog
        self.limits = limits
        self._arrived = arrived  # told of each call refused here, as the ladder counts calls

    def configure(self, settings: Settings) -> None:
        return None  # reads the limits' settings and objectives, which reload themselves

    async def admit(self, entry: Entry) -> Ticket:
        caller, share = entry.caller, self.limits.settings.backlog_share
        if caller is None or caller.time_remaining is None or not share:
            return None
        limit = self.limits.limits.get(entry.pipeline)
        if limit is None:  # an unknown pipeline: NOT_FOUND, once its request is read
            return None
        # The chain's part counts at most half the objective: its median is renewed only by
        # answers, and a stale one past the objective would otherwise refuse every call.
        inside = min(limit.recent, limit.objective / 2)
        wait, allowed = self.backlog.wait(), share * limit.objective
        if wait + inside <= allowed:
            return None
        self._arrived(entry.pipeline)
        message = (
            f"pipeline {entry.pipeline!r}: calls are waiting {wait * 1000:.0f} ms before the "
            f"gateway's door and take {inside * 1000:.0f} ms in it, more than "
            f"{allowed * 1000:.0f} ms of its {limit.objective * 1000:.0f} ms objective; "
            "retry later"
        )
        retry = max(MIN_RETRY_SECONDS, wait)
        self.limits.refuse(entry.pipeline, entry.client, "backlog", message, retry)

    def leave(self, ticket: Ticket, telling: bool) -> None:
        return None
