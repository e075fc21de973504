"""Adaptive concurrency at the door: how many of a pipeline's requests may be in the chain.

Each pipeline's limit follows the gradient between a slow baseline of its latency and its
latency now, as Netflix's concurrency-limits (Gradient2) and Envoy's adaptive concurrency
filter do: while the recent median stays within `tolerance` times the baseline, the limit
grows by about its square root per update (room for a queue of that size), but only while
the limit is being used; beyond it, the limit shrinks in proportion, by up to half per
update. The baseline is an average of recent medians, so a steady load that the chain
answers settles, rather than being refused for ever; the pipeline's latency objective bounds
what that drift can reach: a recent median above `objective_share` of the objective shrinks
the limit whatever the baseline says.

A request beyond the limit waits for a place; how long depends on whether its caller set a
deadline. One that did waits up to `wait_share` of the pipeline's objective, less what calls
now wait before the door (backlog.py), and never past its deadline: an open loop past
capacity is refused within the objective. Among those, places
go oldest first while the queue moves; once its oldest has waited half its patience, newest
first (adaptive LIFO, as Facebook's servers do under overload): the places then go to
requests that can still make their deadline while the oldest wait out their patience,
instead of every request waiting nearly all of it. One whose caller set no deadline (a
closed loop with a client library's defaults) waits in turn, after those with one, until a
place frees or the gateway's default budget runs out, as Triton's queue does with no queue
policy: such a client sends again as soon as it is refused, so a refusal buys nothing and
costs the door CPU; the chain still holds no more than the limit, so what is in it is
answered within the objective. A request that finds `max_waiting` ahead of it, or waits out
its patience, is refused (RESOURCE_EXHAUSTED) with a retry hint of one recent median: about
when a place frees. So that one client cannot fill that queue and keep the others out, a
client may have at most its share of `max_waiting` waiting: an equal share among the clients
waiting, with room kept for one more. While the ladder sheds load nothing waits.

When more than `contention` of the limit is in use, a client may hold at most its share: an
equal share of the limit among the clients holding requests, but never less than
`min_share`, so a client below that floor is not refused for its share because the limit
moved. A client that holds none may enter a little past the limit (its square root), so a
lone client may use the whole limit, yet one flooding the door cannot keep a newcomer out or
take the others' capacity once they hold requests too. While the chain is full, freed places
go to waiting clients below their share first. Every refusal is counted and logged
(services.gateway.door.refusals).
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from services.gateway.door.ladder import LadderController
from services.gateway.door.policy import Checkpoint, Entry
from services.gateway.door.refusals import Refusals
from services.gateway.metrics import CONCURRENCY_LIMIT, SHED
from strata.config.gateway import Concurrency, Ladder
from strata.config.settings import Settings
from strata.errors import Overloaded

MIN_RETRY_SECONDS = 0.001
SMOOTHING = 0.2


class AdaptiveLimit:
    """One pipeline's limit, from the latencies of its recent requests."""

    def __init__(
        self, settings: Concurrency, objective: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.objective = objective
        self.limit = float(settings.initial)
        self.inflight = 0
        self.baseline: float | None = None
        self.recent = 0.0  # the median latency of the last update, seconds
        self.holders: dict[str, int] = {}
        # Requests waiting for a place, oldest first: those whose callers set a deadline,
        # and those whose callers set none.
        self.waiting: list[Waiter] = []
        self.patient: list[Waiter] = []
        self.waiters: dict[str, int] = {}  # requests waiting, by client
        self._samples: list[float] = []
        self._busiest = 0
        self._clock = clock
        self._due = clock() + settings.update_seconds

    def refusal(self, client: str, share: float = 1.0) -> str:
        """Why `client` may not add a request now ("" when it may); `share`: of the limit
        that is open (less while the ladder sheds)."""
        held = self.holders.get(client, 0)
        open_places = max(1, int(self.limit * share))
        if held == 0:
            open_places += max(1, int(math.sqrt(open_places)))  # a newcomer's headroom
        if self.inflight >= open_places:
            return "concurrency" if share >= 1.0 else "level"
        contended = self.inflight >= self.settings.contention * self.limit
        return "client_share" if contended and held + 1 > self.share(client) else ""

    def share(self, client: str) -> float:
        """What `client` may hold under contention: an equal share of the limit among the
        clients holding requests (itself included), never less than `min_share`."""
        sharing = len(self.holders) + (0 if client in self.holders else 1)
        return max(float(self.settings.min_share), self.limit / sharing)

    async def wait(self, client: str, patience: float, deadline: bool = True) -> bool:
        """Wait up to `patience` seconds for a place; True once `client` holds one.
        `deadline`: its caller set one (see the module's docstring)."""
        place = asyncio.get_running_loop().create_future()
        waiter = Waiter(client, place, time.monotonic())
        queue = self.waiting if deadline else self.patient
        queue.append(waiter)
        self.waiters[client] = self.waiters.get(client, 0) + 1
        try:
            async with asyncio.timeout(patience):
                await place
            return True
        except TimeoutError:
            return place.done() and not place.cancelled()  # given one as time ran out
        except asyncio.CancelledError:  # the caller went away
            if place.done() and not place.cancelled():
                self.leave(client, None)
            raise
        finally:
            if not place.done():
                place.cancel()
            if place.cancelled():  # awaiting it was cancelled by the timeout, or by the caller
                queue.remove(waiter)
            self._stop_waiting(client)

    def _stop_waiting(self, client: str) -> None:
        left = self.waiters[client] - 1
        if left:
            self.waiters[client] = left
        else:
            del self.waiters[client]

    def queue_share(self, client: str, max_waiting: int) -> float:
        """How many of `client`'s requests may wait: an equal share of `max_waiting` among
        the clients waiting (itself included), with room kept for one more client."""
        sharing = len(self.waiters) + (0 if client in self.waiters else 1)
        return max_waiting / (sharing + 1)

    @property
    def queued(self) -> int:
        """Requests waiting for a place."""
        return len(self.waiting) + len(self.patient)

    def _wake(self) -> None:
        """Give free places to waiting requests: first to those with a deadline, oldest
        first, or newest first once the oldest has waited half its patience; then to those
        without, oldest first. A client over its share stays waiting."""
        if self.waiting:
            patience = self.settings.wait_share * self.objective
            backed_up = time.monotonic() - self.waiting[0].since > patience / 2
            if not self._give(self.waiting, newest_first=backed_up):
                return
        if self.patient:
            self._give(self.patient, newest_first=False)

    def _give(self, queue: list[Waiter], newest_first: bool) -> bool:
        """Give free places to `queue`'s waiters in that order; False once none is left."""
        given = []
        room = True
        for waiter in reversed(queue) if newest_first else iter(queue):
            if waiter.place.done():  # timed out or its caller left; it removes itself later
                continue
            reason = self.refusal(waiter.client)
            if reason == "concurrency":
                room = False
                break
            if not reason:
                self.enter(waiter.client)
                waiter.place.set_result(None)
                given.append(waiter)
        for waiter in given:
            queue.remove(waiter)
        return room

    def enter(self, client: str) -> None:
        self.inflight += 1
        self.holders[client] = self.holders.get(client, 0) + 1
        self._busiest = max(self._busiest, self.inflight)

    def leave(self, client: str, seconds: float | None) -> None:
        """`client`'s request is done; `seconds` is its latency, None when it tells nothing
        about the chain (a refusal by validation, an answer from the cache)."""
        self.inflight -= 1
        held = self.holders[client] - 1
        if held:
            self.holders[client] = held
        else:
            del self.holders[client]
        self._wake()
        if seconds is not None:
            self._samples.append(seconds)
            now = self._clock()
            if now >= self._due and len(self._samples) >= self.settings.min_samples:
                self._due = now + self.settings.update_seconds
                self._update()

    def _update(self) -> None:
        settings = self.settings
        short = statistics.median(self._samples)
        self._samples.clear()
        busiest, self._busiest = self._busiest, self.inflight
        self.recent = short
        baseline = self._baselined(short)
        gradient = max(0.5, min(1.0, settings.tolerance * baseline / short)) if short else 1.0
        ceiling = settings.objective_share * self.objective
        if short > ceiling:
            gradient = min(gradient, max(0.5, ceiling / short))
        if gradient >= 1.0 and busiest < self.limit / 2:
            return  # the limit is not what holds the load back: no evidence for more
        wanted = self.limit * gradient + math.sqrt(self.limit)
        if wanted > self.limit:  # grow smoothly; shrink at once, before a queue builds
            wanted = self.limit * (1 - SMOOTHING) + wanted * SMOOTHING
        self.limit = min(float(settings.max_limit), max(float(settings.min_limit), wanted))
        self._wake()

    def _baselined(self, short: float) -> float:
        if self.baseline is None:
            self.baseline = short
            return short
        alpha = 2 / (self.settings.baseline_updates + 1)
        self.baseline += alpha * (short - self.baseline)
        if self.baseline > 2 * short:
            self.baseline *= 0.95  # the chain got faster: follow it down sooner
        return self.baseline


@dataclass(frozen=True, slots=True)
class Waiter:
    """A request waiting for a place."""

    client: str
    place: asyncio.Future[None]
    since: float


@dataclass(frozen=True)
class Ticket:
    """A place at the door, held until the request is answered."""

    pipeline: str
    client: str
    started: float


class AdaptiveLimits:
    """The pipelines' adaptive limits; settings and objectives reload live. `refused` is
    told of each refusal's pipeline and reason (the ladder reads overload from them)."""

    def __init__(
        self,
        settings: Concurrency,
        objectives: Mapping[str, float],
        refused: Callable[[str, str], None] = lambda pipeline, reason: None,
    ) -> None:
        self.settings = settings
        self.limits: dict[str, AdaptiveLimit] = {}
        self.refusals = Refusals(settings)
        self._refused = refused
        self.configure(settings, objectives)

    def configure(self, settings: Concurrency, objectives: Mapping[str, float]) -> None:
        self.settings = self.refusals.settings = settings
        for name, objective in objectives.items():
            limit = self.limits.get(name)
            if limit is None:
                self.limits[name] = AdaptiveLimit(settings, objective)
            else:
                limit.settings, limit.objective = settings, objective

    def enter(self, pipeline: str, client: str, shedding: Ladder | None = None) -> Ticket:
        """A place for one request of `client` now, or RESOURCE_EXHAUSTED with a retry hint;
        `shedding`: the ladder's settings while it sheds load (level 4)."""
        limit = self.limits[pipeline]
        reason = limit.refusal(client, shedding.shed_admit_fraction if shedding else 1.0)
        if reason:
            self._refuse(pipeline, client, reason, shedding)
        limit.enter(client)
        return Ticket(pipeline, client, time.monotonic())

    async def admit(
        self,
        pipeline: str,
        client: str,
        shedding: Ladder | None,
        budget: float,
        waited: float | None,
    ) -> Ticket:
        """A place for one request of `client`, waiting for one when only the limit is in
        the way: up to `budget` seconds, and where its caller set a deadline (`waited` is
        then how long calls now wait before the door), up to `wait_share` of the objective
        less that wait, so that the two waits together stay within it."""
        limit = self.limits[pipeline]
        patience = budget
        if waited is not None:
            patience = min(budget, self.settings.wait_share * limit.objective - waited)
        busy = shedding is None and limit.refusal(client) == "concurrency"
        if not busy or patience <= 0:
            return self.enter(pipeline, client, shedding)
        if limit.queued >= self.settings.max_waiting:
            self._refuse(pipeline, client, "queue", None)
        if limit.waiters.get(client, 0) + 1 > limit.queue_share(client, self.settings.max_waiting):
            self._refuse(pipeline, client, "queue_share", None)
        if not await limit.wait(client, patience, waited is not None):
            self._refuse(pipeline, client, "waited", None)
        return Ticket(pipeline, client, time.monotonic())

    def _refuse(self, pipeline: str, client: str, reason: str, shedding: Ladder | None) -> None:
        limit = self.limits[pipeline]
        retry = max(MIN_RETRY_SECONDS, limit.recent)
        if shedding:
            retry = max(retry, shedding.shed_retry_ms / 1000)
        self.refuse(pipeline, client, reason, _refused(pipeline, client, reason, limit), retry)

    def refuse(self, pipeline: str, client: str, reason: str, message: str, retry: float) -> None:
        """Refuse `client`'s request for `reason` (RESOURCE_EXHAUSTED, retry in `retry` s),
        counted, logged and told to the ladder."""
        SHED.labels(reason).inc()
        self.refusals.record(reason, client, message)
        self._refused(pipeline, reason)
        raise Overloaded(message, retry)

    def leave(self, ticket: Ticket, counts: bool) -> None:
        """The ticket's request is done; `counts`: its latency says how the chain is doing."""
        limit = self.limits.get(ticket.pipeline)
        if limit is None:
            return
        limit.leave(ticket.client, time.monotonic() - ticket.started if counts else None)
        CONCURRENCY_LIMIT(ticket.pipeline).set(limit.limit)


class ChainLimit:
    """The adaptive limits as an admission policy, asked as a request boards: a place in the
    chain, of the open part of the limit while the ladder sheds load (level 4)."""

    checkpoint = Checkpoint.BOARDING

    def __init__(
        self, limits: AdaptiveLimits, ladder: LadderController, before_door: Callable[[], float]
    ) -> None:
        self.limits = limits
        self._ladder = ladder
        self._before_door = before_door  # how long calls now wait before the door, seconds

    def configure(self, settings: Settings) -> None:
        self.limits.configure(settings.gateway.concurrency, objectives(settings))

    async def admit(self, entry: Entry) -> Ticket:
        shedding = self._ladder.settings if entry.level >= 4 else None
        budget = entry.deadline.left()
        deadline = entry.caller is not None and entry.caller.time_remaining is not None
        waited = self._before_door() if deadline else None
        return await self.limits.admit(entry.pipeline, entry.client, shedding, budget, waited)

    def leave(self, ticket: Ticket, telling: bool) -> None:
        self.limits.leave(ticket, telling)


def objectives(settings: Settings) -> dict[str, float]:
    """Each pipeline's latency objective, seconds."""
    return {name: p.latency_objective_ms / 1000 for name, p in settings.pipelines.items()}


def _refused(pipeline: str, client: str, reason: str, limit: AdaptiveLimit) -> str:
    held = f"{limit.inflight} of its limit of {int(limit.limit)} requests are in the chain"
    if reason == "client_share":
        mine = f"{limit.holders.get(client, 0)} of {int(limit.share(client))}"
        return f"pipeline {pipeline!r}: this client holds its share ({mine}; {held}); retry later"
    if reason == "level":
        return f"pipeline {pipeline!r}: the gateway is shedding load ({held}); retry later"
    if reason == "queue_share":
        return (
            f"pipeline {pipeline!r} is at its concurrency limit ({held}) and this client has "
            f"{limit.waiters.get(client, 0)} requests waiting, its share of the queue; "
            "retry later"
        )
    if reason == "queue":
        return f"pipeline {pipeline!r} is at its concurrency limit ({held}, {limit.queued} waiting)"
    if reason == "waited":
        return f"pipeline {pipeline!r}: no place freed in time ({held}); retry later"
    return f"pipeline {pipeline!r} is at its concurrency limit ({held}); retry later"
