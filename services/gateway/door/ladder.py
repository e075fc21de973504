"""The degradation ladder: live load signals move the gateway between levels, with hysteresis.

Levels: 0 normal; 1 core postprocess rules only; 2 inference skips batching; 3 answers from
the cache or the pipeline's default answer, marked degraded; 4 shed load with
RESOURCE_EXHAUSTED. Each signal is read against its threshold, its pressure 1 at the
threshold. Three kinds:

- Past capacity, per pipeline: overload, the share of the window's calls that the door
  refused because the pipeline's capacity was spent (its limit full, its queue full, no
  place freed in time, shedding, or a call made late before the door; not a client past its
  own share) against
  `overload_share`; and the wait before the door, for each pipeline with calls: how long the
  gateway's own probe, a health check through the public server's door, took to be answered
  (calls pile up unseen in gRPC's own queue before any handler runs, where the door cannot
  refuse them; services/gateway/door/probe.py), counted from the probes answered after the
  level last moved.
- Congestion inside the gateway: each pipeline's queueing delay (from a request's admission
  through the door to its flight leaving, plus the event loop's lag) against a share of its
  latency objective; each pipeline's P95 latency from admission against its objective; the
  event loop's lag.
- Failure: the upstream error share and the share of upstream queue rejections.

Congestion counts only while its pipeline is past capacity (the event loop's lag, while any
is): a signal of it at pressure 1 or more, or, once the level is above 0, at `down_below` or
more, so that the level does not fall while the excess is still refused. Overload itself
moves nothing, it only lets congestion count; the wait before the door and failures always
count. A closed loop is at capacity, not past it: the time its calls spend in the gateway is
its own choice of how many it keeps in flight (64 photos in flight from one connection took
the ladder to shedding in 1.5 s on queueing delay alone), and a caller without a deadline
waits at the door and is never refused, so no such loop raises overload; an open loop past
capacity arrives faster than it is answered, and its excess is refused at the door or waits
before it. The level steps up after `up_after` ticks at
pressure >= 1 and down after `down_after` ticks below `down_below`, over the readings that
count. A step is taken only where it helps: level 3 gives up full answers, so it is entered
only when full answers cannot meet the objective past capacity (latency, or the wait before
the door, which no full answer can make up) or fail (errors).
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
# The door's refusals that say a pipeline's capacity is spent, not that a client is past its
# own share of it (services/gateway/door/concurrency.py's reasons, and backlog.py's).
CAPACITY_REFUSALS = frozenset({"concurrency", "queue", "waited", "level", "backlog"})
# Per-pipeline signals that a client's own concurrency raises at capacity: they count only
# while their pipeline is past it (the event loop's lag, while any is).
CONGESTION = ("queue_delay", "latency")
# Per-pipeline signals that show a pipeline past capacity: the door refusing its calls, or
# calls piling up before the door, where the door cannot refuse them.
PAST_CAPACITY = ("overload", "door_wait")


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
    arrivals: dict[str, int] = field(default_factory=dict)  # calls reaching a handler
    refused: dict[str, int] = field(default_factory=dict)  # refused for want of capacity
    door_probes: list[float] = field(default_factory=list)  # seconds each probe took

    def seal(self) -> None:
        """Its lists as arrays, once the slot is over: a window joins them many times."""
        for kept in (self.answered, self.waited):
            for pipeline, values in kept.items():
                kept[pipeline] = np.asarray(values)


class Signals:
    """What the ladder watches: outcomes, queueing delays, waits before the door and the
    event loop's lag."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.loop_lag = 0.0  # seconds the event loop last fell behind its tick
        self._clock = clock
        self._slots: deque[tuple[int, Slot]] = deque()

    def arrived(self, pipeline: str) -> None:
        """A call of `pipeline` reached its handler: the wait before the door is its too."""
        arrivals = self._slot().arrivals
        arrivals[pipeline] = arrivals.get(pipeline, 0) + 1

    def refused(self, pipeline: str, reason: str) -> None:
        """The door refused a call of `pipeline` for `reason` (its refusal reasons)."""
        if reason in CAPACITY_REFUSALS:
            refused = self._slot().refused
            refused[pipeline] = refused.get(pipeline, 0) + 1

    def probed(self, seconds: float) -> None:
        """The gateway's own probe through the door was answered after `seconds`."""
        self._slot().door_probes.append(seconds)

    def record(self, pipeline: str, seconds: float, kind: str) -> None:
        """One request's outcome: "ok", "error" (upstream unwell) or "rejected"."""
        slot = self._slot()
        slot.outcomes += 1
        if kind == "ok":
            _add(slot.answered, pipeline, seconds)
        elif kind == "error":
            slot.errors += 1
        elif kind == "rejected":
            slot.rejected += 1

    def queued(self, pipeline: str, seconds: float) -> None:
        """A request of `pipeline` waited `seconds` between its admission and its flight
        leaving."""
        _add(self._slot().waited, pipeline, seconds)

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
        arrivals = sum(slot.arrivals.get(pipeline, 0) for slot in slots)
        if arrivals >= MIN_SAMPLES:
            refused = sum(slot.refused.get(pipeline, 0) for slot in slots)
            parts[f"overload:{pipeline}"] = Reading(refused / arrivals, settings.overload_share)
        latencies = _joined(slot.answered.get(pipeline) for slot in slots)
        if len(latencies) >= MIN_SAMPLES:
            parts[f"latency:{pipeline}"] = Reading(_p95(latencies), objective, " s")
        waits = _joined(slot.waited.get(pipeline) for slot in slots)
        if len(waits) >= MIN_SAMPLES:
            threshold = settings.queue_delay_share * objective
            parts[f"queue_delay:{pipeline}"] = Reading(_p95(waits) + lag, threshold, " s")
    parts.update(_before_door(signals, settings, objectives, moved))
    return parts


def counted(readings: Mapping[str, Reading], past: float = 1.0) -> dict[str, Reading]:
    """The readings that may move the level: congestion inside the gateway only where a
    signal of being past capacity reads at pressure `past` or more; the rest always (see the
    module's docstring)."""
    overloaded = {
        pipeline
        for name, reading in readings.items()
        for kind, _, pipeline in [name.partition(":")]
        if kind in PAST_CAPACITY and reading.pressure >= past
    }

    def counts(name: str) -> bool:
        kind, _, pipeline = name.partition(":")
        if kind == "overload":
            return False
        if kind == "event_loop":
            return bool(overloaded)
        return kind not in CONGESTION or pipeline in overloaded

    return {name: reading for name, reading in readings.items() if counts(name)}


def _before_door(
    signals: Signals, settings: Ladder, objectives: Mapping[str, float], moved: float
) -> dict[str, Reading]:
    """The wait before the door, for each pipeline with calls in the last
    `door_window_seconds`: the median of the probes answered in that window after the level
    last moved (this wait answers a move within a second, so the probes that waited before it
    are not held against the new level). The median, as a probe is one sample of a queue every
    call shares: one late probe (a collection, a stall of the machine) does not move a level."""
    if not settings.door_wait_share:
        return {}
    slots = signals.latest(settings.door_window_seconds, after=moved)
    probes = [seconds for slot in slots for seconds in slot.door_probes]
    if not probes:
        return {}
    wait = float(np.median(probes))
    called = {pipeline for slot in slots for pipeline in slot.arrivals}
    return {
        f"door_wait:{pipeline}": Reading(wait, settings.door_wait_share * objective, " s")
        for pipeline, objective in objectives.items()
        if pipeline in called
    }


def _add(kept: dict[str, list[float] | np.ndarray], pipeline: str, seconds: float) -> None:
    values = kept.setdefault(pipeline, [])
    assert isinstance(values, list)  # only the open slot is added to; a sealed one holds arrays
    values.append(seconds)


def _joined(parts: Iterable[Sequence[float] | np.ndarray | None]) -> np.ndarray:
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
        self.signals = Signals(clock)
        self.level = 0
        self.forced: int | None = None
        self.readings: dict[str, Reading] = {}  # every signal's, shown
        self._counted: dict[str, Reading] = {}  # those that may move the level
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
        # Past capacity at pressure 1, and still so until calm: a gate that closed at once
        # would step down while the excess is still refused.
        past = 1.0 if self.level == 0 else self.settings.down_below
        self._counted = counted(self.readings, past)
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
        if not self._counted:  # no failures read yet, and no overload
            return "overload", Reading(0.0, self.settings.overload_share)
        return max(self._counted.items(), key=lambda item: item[1].pressure)

    def _may_climb(self) -> bool:
        """Whether the next level up can help: levels 3 and 4 give up full answers, worth it
        only while full answers miss the objective past capacity or fail."""
        if self.level >= self.settings.max_level:
            return False
        return self.level < 2 or any(
            name.startswith(FULL_ANSWERS_FAIL) and reading.pressure >= 1.0
            for name, reading in self._counted.items()
        )

    def _move(self, level: int, why: str) -> None:
        old, self.level = self.level, level
        self._above = self._calm = 0
        self.reason = why
        if old != level:
            self._moved = self._clock()
            log.warning("degradation level %d -> %d (%s): %s", old, level, LEVELS[level], why)
            self._on_change(old, level, why)
