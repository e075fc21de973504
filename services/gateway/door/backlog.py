"""The wait before the door as it stands, and the door refusing on arrival while it is longer
than a pipeline's objective can afford.

Past capacity, calls wait in gRPC's own queue before any handler runs (probe.py); a call that
reaches its handler after waiting most of its pipeline's objective cannot be answered in time,
and answering it costs the CPU that the calls behind it needed to be on time, so every later
call is late too (goodput fell to a tenth of capacity at 1.5x). So while calls wait before
the door longer than `backlog_share` of the objective, a call whose caller set a deadline is
refused on arrival (RESOURCE_EXHAUSTED, reason `backlog`, a retry hint of the wait), before
its inputs are read or it takes a place, where a refusal costs about half an answer
(docs/gateway.md, Admission). The share is a target the queue is held at, as CoDel holds a
queue at its target, not a call's lateness: once a queue stands, the gateway clears calls
about as fast as they come, so the wait stays where it is while the door refuses, and a
threshold at the whole objective held it there, with every admitted call late (78% refused
at 1.5x, admitted P99 331 ms against a 250 ms objective). Held at half the objective, what
is admitted has the other half for the door and the chain. A caller without a deadline (a
closed loop with a client library's defaults) is never refused here: it sends again at
once, and its own concurrency bounds it.

The wait is every client's, but only the clients that make it are refused for it: a call is
refused only if its client sent at least half an equal share of the calls that arrived over
the last `ARRIVAL_WINDOW` or two (equal among the clients that sent any), so a polite client
beside a flooding one keeps being answered, while a lone client past capacity, or many alike,
are refused as before. Arrivals are counted by the identity the door proved (identity.py),
never by what a header claims.

The wait is the gateway's own measurement, never a client's deadline: the lesser of the last
two probes' times (a queue that stands; one late probe refuses nothing), or the time the
probe in flight has waited so far where that is longer (a queue building up shows before the
probe comes back), less the time the event loop's thread spent meanwhile waiting for a CPU
(Linux's schedstat) where fewer than a queue's worth of calls reached the door, else the
loop's lag: a machine short of cores adds that wait to every probe without any call waiting
before the door, while past capacity the calls behind which the probe waited come in by the
hundred, and the loop's waits for a CPU are theirs too. The loop's lag, one
timer's lateness a tick, took off a fraction of it: with other work keeping two cores busy
(load 9 to 12), a probe crosses the loop several times, and a trickle of calls was refused as
if the gateway were past capacity.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from services.gateway.door.concurrency import AdaptiveLimits
from services.gateway.door.policy import Checkpoint, Entry, Ticket
from strata.config.settings import Settings
from strata.process.runqueue import RunQueue

# The shortest retry hint: the queue has not drained until a probe has passed it.
MIN_RETRY_SECONDS = 0.01
# Calls reaching the door during a probe's flight that make a queue it waited behind: past
# capacity hundreds come in the objective's share (1,000/s x 125 ms); a trickle brings one.
QUEUE_CALLS = 8
# Arrivals are counted over this window and the one before it (seconds).
ARRIVAL_WINDOW = 1.0
# A client sending less than this share of an equal share of the arrivals is not refused.
FLOOD_SHARE = 0.5


class Backlog:
    """The wait before the door now, from the probe's sends and answers (probe.py), less the
    time the event loop's thread waited for a CPU meanwhile (`runqueue`: that thread's
    seconds runnable, cumulative; strata/process/runqueue.py), or where a queue's worth of
    calls reached the door during it or the kernel says nothing, less `lag`, the event
    loop's latest lag."""

    def __init__(
        self,
        lag: Callable[[], float],
        clock: Callable[[], float] = time.monotonic,
        runqueue: Callable[[], float | None] | None = None,
    ) -> None:
        self.last = 0.0  # the last probe's wait, less the stall of the machine, seconds
        self._before = 0.0  # the one before it
        self._sent: float | None = None  # when the probe in flight was sent
        self._queued: float | None = None  # the loop thread's run-queue wait then
        self._calls = 0  # calls that reached the door, ever
        self._calls_then = 0  # ... when the probe in flight was sent
        self._lag = lag
        self._clock = clock
        self._runqueue = RunQueue() if runqueue is None else runqueue

    def arrived(self) -> None:
        """A call reached the door."""
        self._calls += 1

    def sent(self) -> None:
        """A probe leaves (called on the event loop's thread: its run queue is read)."""
        self._sent = self._clock()
        self._queued = self._runqueue()
        self._calls_then = self._calls

    def answered(self, seconds: float) -> float:
        """The probe in flight was answered after `seconds`: that wait less the stall."""
        stall = self._stall()
        self._sent = None
        self._before, self.last = self.last, max(0.0, seconds - stall)
        return self.last

    def lost(self) -> None:
        """The probe in flight never reached the server (not yet, or no longer, up)."""
        self._sent = None

    def wait(self) -> float:
        """Seconds a call that reaches its handler now waited before the door, about: the
        lesser of the last two probes' (a queue that stands, not one late probe), or the
        probe in flight's wait so far where that is longer."""
        standing = min(self._before, self.last)
        if self._sent is None:
            return standing
        waiting = self._clock() - self._sent
        if waiting <= standing:  # read on every call past capacity: no stall to read
            return standing
        return max(standing, waiting - self._stall())

    def _stall(self) -> float:
        """Seconds of the probe in flight that were the machine's, not a queue's: the time
        the loop's thread waited for a CPU, unless `QUEUE_CALLS` or more calls reached the
        door meanwhile (a loop past capacity waits for a CPU while calls wait for it, which is
        the door's wait too) or the kernel does not count it: then the loop's lag."""
        if self._queued is None or self._calls - self._calls_then >= QUEUE_CALLS:
            return self._lag()
        now = self._runqueue()
        return self._lag() if now is None else max(0.0, now - self._queued)


class Arrivals:
    """Calls that arrived, by client, over the current window and the one before it, with
    their sum and the number of clients counted as they come: read on every call past
    capacity, where a flood naming each call a new client would make a sum over the clients
    cost as much as the calls."""

    def __init__(
        self, window: float = ARRIVAL_WINDOW, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._window = window
        self._clock = clock
        self._ends = clock() + window
        self._now: dict[str, int] = {}
        self._before: dict[str, int] = {}
        self._calls = 0  # in both windows
        self._clients = 0  # that sent any in either

    def add(self, client: str) -> None:
        now = self._clock()
        if now >= self._ends:
            late = now - self._ends >= self._window  # a whole window passed without a call
            self._before, self._now = ({} if late else self._now), {}
            self._calls, self._clients = sum(self._before.values()), len(self._before)
            self._ends = now + self._window
        if client not in self._now and client not in self._before:
            self._clients += 1
        self._now[client] = self._now.get(client, 0) + 1
        self._calls += 1

    def flooding(self, client: str) -> bool:
        """Whether `client` sent at least `FLOOD_SHARE` of an equal share of the calls that
        arrived, among the clients that sent any."""
        mine = self._now.get(client, 0) + self._before.get(client, 0)
        return mine * self._clients >= FLOOD_SHARE * self._calls


class BacklogLimit:
    """Refuses on arrival a call with a deadline while the wait before the door is longer
    than `backlog_share` of its pipeline's objective, if its client sends its share of the
    calls or more."""

    checkpoint = Checkpoint.ARRIVAL

    def __init__(
        self, backlog: Backlog, limits: AdaptiveLimits, arrived: Callable[[str], None]
    ) -> None:
        self.backlog = backlog
        self.limits = limits
        self._arrived = arrived  # told of each call refused here, as the ladder counts calls
        self.arrivals = Arrivals()

    def configure(self, settings: Settings) -> None:
        return None  # reads the limits' settings and objectives, which reload themselves

    async def admit(self, entry: Entry) -> Ticket:
        caller, share = entry.caller, self.limits.settings.backlog_share
        if not share:
            return None
        self.arrivals.add(entry.client)
        self.backlog.arrived()
        if caller is None or caller.time_remaining is None:
            return None
        limit = self.limits.limits.get(entry.pipeline)
        if limit is None:  # an unknown pipeline: NOT_FOUND, once its request is read
            return None
        wait, allowed = self.backlog.wait(), share * limit.objective
        if wait <= allowed or not self.arrivals.flooding(entry.client):
            return None
        self._arrived(entry.pipeline)
        message = (
            f"pipeline {entry.pipeline!r}: calls are waiting {wait * 1000:.0f} ms before the "
            f"gateway's door, more than {allowed * 1000:.0f} ms of its "
            f"{limit.objective * 1000:.0f} ms objective; retry later"
        )
        retry = max(MIN_RETRY_SECONDS, wait)
        self.limits.refuse(entry.pipeline, entry.client, "backlog", message, retry)

    def leave(self, ticket: Ticket, telling: bool) -> None:
        return None
