"""The degradation ladder: live load signals move the gateway between levels, with hysteresis.

Levels: 0 normal; 1 core postprocess rules only; 2 inference skips batching; 3 answers from
the cache or the pipeline's default answer, marked degraded; 4 shed load with
RESOURCE_EXHAUSTED. Each signal is read against its threshold, its pressure 1 at the
threshold: each pipeline's queueing delay (from a request's arrival to its flight leaving,
plus the event loop's lag: work queued before any handler starts) against a share of its
latency objective; each pipeline's P95 latency against its objective; the upstream error
share; the share of upstream queue rejections; the event loop's lag alone; and each pipeline's
wait before the door, as its clients see it: how much more of a client's deadline was already
spent when its call reached a handler than the least it has lately spent (calls wait unseen in
gRPC's own queue before any handler runs; a deadline, set when the call arrived, keeps the
time), counted from the calls that came after the level last moved. The level steps up
after `up_after` ticks at pressure >= 1 and down after `down_after` ticks below `down_below`.
A step is taken only where it helps: level 3 gives up full answers, so it is entered only
when the full pipeline cannot meet its objective (latency, or the wait before the door, which
no full answer can make up) or its upstreams fail (errors).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from services.gateway.metrics import LADDER_SIGNAL
from strata.config.gateway import Ladder

log = logging.getLogger(__name__)

LEVELS = ("normal", "core_rules_only", "skip_batching", "cache_or_default", "shed")
MIN_SAMPLES = 5
# Signals for which giving up full answers (level 3 and beyond) can help.
FULL_ANSWERS_FAIL = ("latency:", "door_wait:", "errors")
MOST_CLIENTS = 4096  # deadline references kept; the least recently seen go first


@dataclass(frozen=True)
class Reading:
    """One signal's value against its threshold."""

    value: float
    threshold: float
    unit: str = ""

    @property
    def pressure(self) -> float:
        return self.value / self.threshold

    def __str__(self) -> str:
        return f"{self.value:.3g}{self.unit} against {self.threshold:.3g}{self.unit}"


SLOT_SECONDS = 0.25  # signals are kept per slot of time: a window is whole slots


@dataclass
class Slot:
    """What happened in one slot of time: each request's outcome is counted, and its
    latency and queueing kept by pipeline, so that a tick reads a window of thousands of
    requests as a handful of slots (a pass over every request cost 5% of the gateway)."""

    outcomes: int = 0
    errors: int = 0  # upstream unwell
    rejected: int = 0  # a full queue upstream
    answered: dict[str, list[float] | np.ndarray] = field(default_factory=dict)  # seconds
    waited: dict[str, list[float] | np.ndarray] = field(default_factory=dict)
    before_door: dict[str, list[float] | np.ndarray] = field(default_factory=dict)

    def seal(self) -> None:
        """Its lists as arrays, once the slot is over: a window joins them many times."""
        for kept in (self.answered, self.waited, self.before_door):
            for pipeline, values in kept.items():
                kept[pipeline] = np.asarray(values)


class Deadlines:
    """Each client's reference: the most time its calls lately had left on reaching a handler.

    gRPC sets a call's deadline when the call arrives, from the client's grpc-timeout, but
    does not say what the timeout was; a client's calls usually carry the same one, so the
    most any of them had left is what one had that did not wait, and another's shortfall from
    it is how long that one waited before a handler ran. A reference not matched (to within
    `MATCHED` seconds) for `memory` seconds gives way to the next call's time left, so that a
    client that shortens its deadlines is believed again; a wait longer than that memory reads
    as none.
    """

    MATCHED = 0.002

    def __init__(self, memory: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.memory = memory
        self._clock = clock
        self._longest: dict[str, tuple[float, float]] = {}  # client: (seconds left, when)

    def waited(self, client: str, remaining: float) -> float:
        """How long `client`'s call, with `remaining` seconds left, waited before a handler."""
        now = self._clock()
        longest, seen = self._longest.pop(client, (remaining, now))
        if now - seen > self.memory:
            longest = remaining
        if remaining >= longest - self.MATCHED:
            longest, seen = max(longest, remaining), now
        self._longest[client] = (longest, seen)  # last, as the most recently seen
        if len(self._longest) > MOST_CLIENTS:
            del self._longest[next(iter(self._longest))]
        return max(0.0, longest - remaining)


class Signals:
    """What the ladder watches: outcomes, queueing delays, waits before the door and the
    event loop's lag."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, memory: float = 60.0) -> None:
        self.loop_lag = 0.0  # seconds the event loop last fell behind its tick
        self._clock = clock
        self._slots: deque[tuple[int, Slot]] = deque()
        self.deadlines = Deadlines(memory, clock)

    def arrived(self, pipeline: str, client: str, remaining: float | None) -> None:
        """A call of `pipeline` from `client` reached its handler with `remaining` seconds of
        its deadline left (None: it set none, and says nothing of its wait)."""
        if remaining is None or not math.isfinite(remaining):
            return
        waited = self.deadlines.waited(client, remaining)
        self._slot().before_door.setdefault(pipeline, []).append(waited)

    def record(self, pipeline: str, seconds: float, kind: str) -> None:
        """One request's outcome: "ok", "error" (upstream unwell) or "rejected"."""
        slot = self._slot()
        slot.outcomes += 1
        if kind == "ok":
            slot.answered.setdefault(pipeline, []).append(seconds)
        elif kind == "error":
            slot.errors += 1
        elif kind == "rejected":
            slot.rejected += 1

    def queued(self, pipeline: str, seconds: float) -> None:
        """A request of `pipeline` waited `seconds` between arriving and its flight leaving."""
        self._slot().waited.setdefault(pipeline, []).append(seconds)

    def recent(self, seconds: float) -> list[Slot]:
        """The slots of the last `seconds` (to within a slot); older ones are forgotten."""
        first = int((self._clock() - seconds) // SLOT_SECONDS)
        while self._slots and self._slots[0][0] < first:
            self._slots.popleft()
        return [slot for _, slot in self._slots]

    def latest(self, seconds: float, after: float = -math.inf) -> list[Slot]:
        """The slots of the last `seconds` (to within a slot) that began after `after`,
        forgetting none."""
        first = int((self._clock() - seconds) // SLOT_SECONDS)
        if math.isfinite(after):
            first = max(first, int(after // SLOT_SECONDS) + 1)
        return [slot for number, slot in self._slots if number >= first]

    def _slot(self) -> Slot:
        number = int(self._clock() // SLOT_SECONDS)
        if not self._slots or self._slots[-1][0] != number:
            if self._slots:
                self._slots[-1][1].seal()
            self._slots.append((number, Slot()))
        return self._slots[-1][1]


def readings(
    signals: Signals,
    settings: Ladder,
    objectives: Mapping[str, float],
    moved: float = -math.inf,
) -> dict[str, Reading]:
    """Each signal's reading (pressure 1.0 = at its threshold); the wait before the door only
    from calls that came after the level last `moved`."""
    slots = signals.recent(settings.window_seconds)
    lag = signals.loop_lag
    parts = {"event_loop": Reading(lag * 1000, settings.loop_lag_limit_ms, " ms")}
    outcomes = sum(slot.outcomes for slot in slots)
    if outcomes and outcomes >= settings.min_error_samples:
        errors = sum(slot.errors for slot in slots)
        rejected = sum(slot.rejected for slot in slots)
        parts["errors"] = Reading(errors / outcomes, settings.error_rate_limit)
        parts["rejections"] = Reading(rejected / outcomes, settings.rejection_rate_limit)
    for pipeline, objective in objectives.items():
        latencies = _joined(slot.answered.get(pipeline) for slot in slots)
        if len(latencies) >= MIN_SAMPLES:
            parts[f"latency:{pipeline}"] = Reading(_p95(latencies), objective, " s")
        waits = _joined(slot.waited.get(pipeline) for slot in slots)
        if len(waits) >= MIN_SAMPLES:
            threshold = settings.queue_delay_share * objective
            parts[f"queue_delay:{pipeline}"] = Reading(_p95(waits) + lag, threshold, " s")
    parts.update(_before_door(signals, settings, objectives, moved))
    return parts


def _before_door(
    signals: Signals, settings: Ladder, objectives: Mapping[str, float], moved: float
) -> dict[str, Reading]:
    """Each pipeline's P95 wait before the door over the last `door_window_seconds`, from
    calls that came after the level last moved: this wait answers a move within a second, so
    the calls that waited before it are not held against the new level."""
    if not settings.door_wait_share:
        return {}
    slots = signals.latest(settings.door_window_seconds, after=moved)
    parts = {}
    for pipeline, objective in objectives.items():
        waits = _joined(slot.before_door.get(pipeline) for slot in slots)
        if len(waits) >= MIN_SAMPLES:
            threshold = settings.door_wait_share * objective
            parts[f"door_wait:{pipeline}"] = Reading(_p95(waits), threshold, " s")
    return parts


def _joined(parts: Iterable[Sequence[float] | None]) -> np.ndarray:
    kept = [values for values in parts if values is not None and len(values)]
    return np.concatenate(kept) if kept else np.empty(0)


def _p95(values: np.ndarray) -> float:
    return float(np.percentile(values, 95))


class LadderController:
    """Decides the level once per tick; a forced level overrides the signals."""

    def __init__(
        self,
        settings: Ladder,
        objectives: Mapping[str, float],
        on_change: Callable[[int, int, str], None] = lambda old, new, why: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.objectives = dict(objectives)
        self.signals = Signals(clock, settings.deadline_memory_seconds)
        self.level = 0
        self.forced: int | None = None
        self.readings: dict[str, Reading] = {}
        self.reason = "no signal has reached its threshold"
        self._on_change = on_change
        self._above = 0
        self._calm = 0
        self._clock = clock
        self._moved = -math.inf  # when the level last changed

    def configure(self, settings: Ladder, objectives: Mapping[str, float]) -> None:
        """New thresholds and latency objectives, live; the signals and level stay."""
        self.settings = settings
        self.objectives = dict(objectives)
        self.signals.deadlines.memory = settings.deadline_memory_seconds

    def force(self, level: int | None) -> None:
        """Pin the ladder at `level`, or release it (None) to follow the signals again."""
        self.forced = level
        if level is not None:
            self._move(level, "forced from the admin API")

    @property
    def last_pressure(self) -> dict[str, float]:
        return {name: reading.pressure for name, reading in self.readings.items()}

    def tick(self) -> int:
        self.readings = readings(self.signals, self.settings, self.objectives, self._moved)
        for name, reading in self.readings.items():
            LADDER_SIGNAL(name, "value").set(reading.value)
            LADDER_SIGNAL(name, "threshold").set(reading.threshold)
        if self.forced is not None:
            return self.level
        name, worst = self._worst()
        if worst.pressure >= 1.0:
            self._above, self._calm = self._above + 1, 0
            if self._above >= self.settings.up_after and self._may_climb():
                self._move(self.level + 1, f"{name} {worst} (pressure {worst.pressure:.2f})")
        elif worst.pressure < self.settings.down_below:
            self._above, self._calm = 0, self._calm + 1
            if self._calm >= self.settings.down_after and self.level > 0:
                self._move(self.level - 1, f"calm: worst {name} {worst}")
        else:
            self._above = self._calm = 0
        return self.level

    def _worst(self) -> tuple[str, Reading]:
        return max(self.readings.items(), key=lambda item: item[1].pressure)

    def _may_climb(self) -> bool:
        """Whether the next level up can help: levels 3 and 4 give up full answers, worth it
        only while full answers miss the objective or fail."""
        if self.level >= self.settings.max_level:
            return False
        return self.level < 2 or any(
            name.startswith(FULL_ANSWERS_FAIL) and reading.pressure >= 1.0
            for name, reading in self.readings.items()
        )

    def _move(self, level: int, why: str) -> None:
        old, self.level = self.level, level
        self._above = self._calm = 0
        self.reason = why
        if old != level:
            self._moved = self._clock()
            log.warning("degradation level %d -> %d (%s): %s", old, level, LEVELS[level], why)
            self._on_change(old, level, why)
