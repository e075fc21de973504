"""When a queued batch should start: the batching policies and what they measure.

A policy answers one question each time a worker slot is free: start the batch that is
queued now, or wait until a given time for more requests to join. The adaptive policy bases
its answer on three live measurements: the execution time of a batch (fitted against its
rows), the arrival rate of rows, and how busy the worker slots are.
"""

from __future__ import annotations

import math
from typing import Protocol

from strata.config.inference import InferenceSettings


class ExecutionModel:
    """Batch execution time as `fixed + per_row * rows`, fitted by least squares over recent
    batches (older ones count less, so the fit follows a machine whose load changes)."""

    def __init__(self, decay: float = 0.97) -> None:
        self._decay = decay
        self._w = self._n = self._nn = self._t = self._nt = 0.0

    def observe(self, rows: int, seconds: float) -> None:
        """A batch of `rows` rows took `seconds`."""
        d = self._decay
        self._w = self._w * d + 1.0
        self._n = self._n * d + rows
        self._nn = self._nn * d + rows * rows
        self._t = self._t * d + seconds
        self._nt = self._nt * d + rows * seconds

    @property
    def known(self) -> bool:
        return self._w > 0

    def coefficients(self) -> tuple[float, float]:
        """(fixed seconds, seconds per row), both at least zero."""
        if not self._w:
            return 0.0, 0.0
        spread = self._w * self._nn - self._n * self._n
        mean_n, mean_t = self._n / self._w, self._t / self._w
        # With (almost) one batch size seen, the slope is unknown: charge it all per batch.
        if spread <= 1e-9 * self._w * self._nn:
            return mean_t, 0.0
        per_row = (self._w * self._nt - self._n * self._t) / spread
        if per_row < 0:
            return mean_t, 0.0
        fixed = mean_t - per_row * mean_n
        if fixed < 0:
            return 0.0, self._nt / self._nn
        return fixed, per_row

    def estimate(self, rows: int) -> float:
        """Seconds a batch of `rows` rows is expected to take (0 before any is measured)."""
        fixed, per_row = self.coefficients()
        return fixed + per_row * rows


class ArrivalRate:
    """Rows per second arriving, from a moving average of the gaps between requests."""

    def __init__(self, weight: float = 0.1) -> None:
        self._weight = weight
        self._last: float | None = None
        self._gap = math.inf
        self._rows = 1.0

    def observe(self, now: float, rows: int) -> None:
        """A request of `rows` rows arrived at `now`."""
        if self._last is not None:
            gap = max(now - self._last, 1e-7)
            self._gap = (
                gap if math.isinf(self._gap) else self._gap + self._weight * (gap - self._gap)
            )
            self._rows += self._weight * (rows - self._rows)
        self._last = now

    def rows_per_second(self, now: float) -> float:
        if self._last is None or math.isinf(self._gap):
            return 0.0
        # A quiet spell longer than the average gap lowers the rate at once.
        return self._rows / max(self._gap, now - self._last)


class Utilization:
    """The share of worker slots busy, a time-weighted moving average over about `horizon`
    seconds."""

    def __init__(self, slots: int, horizon: float = 0.25) -> None:
        self._slots = slots
        self._horizon = horizon
        self._last = 0.0
        self._busy = 0
        self._value = 0.0

    def change(self, now: float, busy: int) -> None:
        """`busy` slots are running from `now` on."""
        self._value = self.value(now)
        self._last, self._busy = now, busy

    def value(self, now: float) -> float:
        keep = math.exp(-max(now - self._last, 0.0) / self._horizon)
        return self._value * keep + (self._busy / self._slots) * (1.0 - keep)


class Policy(Protocol):
    """Decides when the batch that could be formed now should start."""

    batches: bool  # False: every request runs alone

    def start_at(self, now: float, oldest: float, rows: int) -> float:
        """The time to start a batch of `rows` whose oldest request arrived at `oldest`;
        `now` or earlier means now."""
        ...


class NoBatching:
    """Every request runs alone, as soon as a worker slot is free."""

    batches = False

    def start_at(self, now: float, oldest: float, rows: int) -> float:
        return now


class FixedWindow:
    """Wait up to a fixed time from the oldest request for the batch to fill (Triton's
    dynamic batcher with max_queue_delay), even when the model is idle."""

    batches = True

    def __init__(self, window: float, max_rows: int) -> None:
        self._window = window
        self._max_rows = max_rows

    def start_at(self, now: float, oldest: float, rows: int) -> float:
        return now if rows >= self._max_rows else oldest + self._window


class Adaptive:
    """Start at once when the batch is full or no other request is expected in time;
    otherwise wait, from the oldest request, `fraction` of the measured time a batch of this
    size takes, stretched by 1 / (1 - utilization) of the worker slots, and never more than
    `max_wait`.

    The measured batch time is the time from a batch's start until its answers are back on
    the event loop, so it includes what the run costs beyond ONNX Runtime: the hand-off to a
    worker thread and back, which on a busy process (the event loop holding the GIL) can be
    many times the run itself. That is the cost a batch pays once for all its requests, so
    the more it grows, the more waiting for company pays. At low load no other request is
    expected within the bound and a lone request runs at once: an idle model adds no wait.
    Requests that gathered while the worker slots were busy have usually waited past the
    bound already, so after a long batch the next one starts as soon as a slot frees.

    The stretch is for saturation: when the slots are busy nearly all the time, a free slot
    that starts a small batch at once only moves the queue into the next one, while waiting
    for a bigger batch pays each batch's fixed cost for more rows, so the policy approaches
    the full `max_wait` (the best fixed window's behaviour) as the slots fill.
    """

    batches = True

    def __init__(
        self,
        max_wait: float,
        fraction: float,
        max_rows: int,
        execution: ExecutionModel,
        arrivals: ArrivalRate,
        utilization: Utilization,
    ) -> None:
        self._max_wait = max_wait
        self._fraction = fraction
        self._max_rows = max_rows
        self._execution = execution
        self._arrivals = arrivals
        self._utilization = utilization

    def start_at(self, now: float, oldest: float, rows: int) -> float:
        if rows >= self._max_rows:
            return now
        idle = max(1.0 - self._utilization.value(now), 1e-3)
        share = self._fraction * self._execution.estimate(rows) / idle
        bound = min(self._max_wait, share)
        at = oldest + bound
        if at <= now or self._arrivals.rows_per_second(now) * (at - now) < 1.0:
            return now
        return at


def make_policy(
    settings: InferenceSettings.Batching,
    max_rows: int,
    execution: ExecutionModel,
    arrivals: ArrivalRate,
    utilization: Utilization,
) -> Policy:
    """The policy a model's batching settings name."""
    window = settings.max_queue_delay_ms / 1000.0
    if settings.policy == "none":
        return NoBatching()
    if settings.policy == "fixed":
        return FixedWindow(window, max_rows)
    return Adaptive(window, settings.wait_fraction, max_rows, execution, arrivals, utilization)
