"""A padded batch run in buckets of rows of like length, so padding costs (almost) nothing.

A model whose inputs pad (model.yaml `padding`) is fed every row padded to the batch's
longest, and preprocess already pads a flight's texts to the flight's longest; a transformer
spends as much on a padded token as on a real one, so a flight of 16 sentences of 4 to 43
tokens cost more per sentence than 16 sentences run one at a time. Here, where the model's
inputs pad along one dimension (`sequence`) that no output has, each row's trailing padding
(the columns where every padded input holds its pad value) is cut off, the rows are sorted
by the length left and split where one more session call costs less than the padding it
saves, and each bucket runs cut to its own longest row; the answers go back to the rows'
places. model.yaml's `padding` says that padding a row leaves its answer as it was, so
cutting the padding off does too.

A bucket of `rows` rows cut to `longest` cells costs, in padded cells, `call + rows * (longest
+ square * longest**2)`: the call's own cost (MiniLM streams its weights once a call, some
2 ms, whatever the rows), each cell's, and attention's scores, which grow with the square of
the length. A row's own fixed cost is paid however the rows are split, so it is left out.
The three are fitted at load from timed calls (`calibrate`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from services.inference.signature import Signature
from strata.errors import StrataError
from strata.wire.codec import DTYPES, Arrays

Run = Callable[[Arrays], Arrays]
# One row at three lengths (cells), far enough apart that the square term shows, and
# _ROWS rows of one cell: what a call costs beyond its rows is what merging them saves.
_LENGTHS = (1, 33, 65)
_ROWS = 8
_TRIES = 5  # the quickest of so many timed calls


@dataclass(frozen=True)
class Costs:
    """A bucket's cost in padded cells: `call` for the session call, and `longest + square *
    longest**2` for each of its rows. An infinite `call` never splits a batch."""

    call: float = math.inf
    square: float = 0.0

    def __str__(self) -> str:
        if math.isinf(self.call):
            return "never split (a call's cost is not measurable)"
        return f"a call costs {self.call:.1f} cells, square {self.square:.5f}"


@dataclass(frozen=True)
class Buckets:
    """How one model's padded inputs are cut: the axis-1 `sequence` dimension of each."""

    pads: dict[str, float]  # padded input -> its pad value
    costs: Costs

    def run(self, batch: Arrays, run: Run) -> Arrays:
        """`run` over `batch` in buckets; its outputs in the batch's row order."""
        lengths = self.lengths(batch)
        order = np.argsort(lengths, kind="stable")
        groups = plan(lengths[order], self.costs)
        parts = []
        for start, stop in groups:
            rows = order[start:stop]
            longest = int(lengths[rows].max())
            parts.append((rows, run(self._cut(batch, rows, longest))))
        return _gather(parts, len(lengths))

    def lengths(self, batch: Arrays) -> np.ndarray:
        """Each row's length without its trailing padding (at least 1)."""
        real: np.ndarray | None = None
        for name, pad in self.pads.items():
            values = batch[name]
            differs = values != np.asarray(pad, dtype=values.dtype)
            columns = differs.reshape(*differs.shape[:2], -1).any(axis=2)
            real = columns if real is None else real | columns
        assert real is not None  # a Buckets has at least one padded input
        width = real.shape[1]
        last = width - np.argmax(real[:, ::-1], axis=1)
        return np.where(real.any(axis=1), last, 1)

    def _cut(self, batch: Arrays, rows: np.ndarray, longest: int) -> Arrays:
        whole = len(rows) == len(next(iter(batch.values())))
        cut = {}
        for name, values in batch.items():
            picked = values if whole and _in_order(rows) else values[rows]
            if name in self.pads:
                picked = np.ascontiguousarray(picked[:, :longest])
            cut[name] = picked
        return cut


def buckets_of(signature: Signature) -> dict[str, float] | None:
    """The padded inputs a batch may be cut along, with their pad values, or None where it
    may not be: the model pads nothing, its padded inputs have other open dimensions than
    one shared one after the batch, an input that does not pad has that dimension, or an
    output has it (the answer's shape would follow the cut)."""
    if not signature.padded or not signature.batchable:
        return None
    names: set[str | None] = set()
    for info in signature.inputs:
        if info.name not in signature.padded:
            continue
        open_dims = [d for d, s in zip(info.dims[1:], info.shape[1:], strict=True) if s == -1]
        if len(open_dims) != 1 or info.shape[1] != -1:
            return None
        names.add(open_dims[0])
    if len(names) != 1 or None in names:
        return None
    (dim,) = names
    others = [t for t in signature.inputs if t.name not in signature.padded]
    if any(dim in t.dims for t in [*others, *signature.outputs]):
        return None
    return dict(signature.padded)


def calibrate(signature: Signature, pads: dict[str, float], run: Run) -> Costs:
    """The costs of a bucket, fitted to timed calls (the quickest of a few each, blocking):
    one row at each of _LENGTHS cells and _ROWS rows of one cell. Never split (an infinite
    call) where the length costs nothing measurable, as where the model refuses such rows."""
    try:
        one = [_quickest(run, _rows(signature, pads, 1, n)) for n in _LENGTHS]
        many = _quickest(run, _rows(signature, pads, _ROWS, 1))
    except StrataError:
        return Costs()
    return fit(one, many)


def fit(one: list[float], many: float) -> Costs:
    """Costs from the seconds of one row at each of _LENGTHS and of _ROWS rows of one cell,
    taking t(rows, n) = call + rows * (own + cell * n + square * n**2)."""
    (a, b, c), (ta, tb, tc) = _LENGTHS, one
    low, high = (tb - ta) / (b - a), (tc - tb) / (c - b)  # cell + square * (a + b), (b + c)
    square = max(0.0, (high - low) / (c - a))
    cell = low - square * (a + b)
    if cell <= 0:
        return Costs()
    call = max(0.0, (_ROWS * ta - many) / (_ROWS - 1))
    return Costs(call / cell, square / cell)


def plan(lengths: np.ndarray, costs: Costs) -> list[tuple[int, int]]:
    """Sorted `lengths` split into [start, stop) runs so that the calls' own cost plus every
    row padded to its run's longest is least (Costs says what a run costs)."""
    count = len(lengths)
    if math.isinf(costs.call) or count == 1:
        return [(0, count)]
    padded = lengths + costs.square * lengths.astype(np.float64) ** 2  # a row at each length
    best = np.zeros(count + 1)
    cut = np.zeros(count + 1, dtype=np.int64)
    starts = np.arange(count)
    for stop in range(1, count + 1):
        runs = best[:stop] + costs.call + (stop - starts[:stop]) * padded[stop - 1]
        cut[stop] = int(np.argmin(runs))
        best[stop] = runs[cut[stop]]
    runs, stop = [], count
    while stop > 0:
        runs.append((int(cut[stop]), stop))
        stop = int(cut[stop])
    return runs[::-1]


def _gather(parts: list[tuple[np.ndarray, Arrays]], rows: int) -> Arrays:
    """Each output's buckets put back in row order."""
    if len(parts) == 1 and _in_order(parts[0][0]):
        return parts[0][1]
    out = {}
    for name, first in parts[0][1].items():
        tails = {part[name].shape[1:] for _, part in parts}
        if len(tails) != 1:
            raise RuntimeError(
                f"output {name!r} has shapes {sorted(tails)} in buckets of different lengths"
            )
        whole = np.empty((rows, *first.shape[1:]), dtype=first.dtype)
        for indices, part in parts:
            whole[indices] = part[name]
        out[name] = whole
    return out


def _in_order(rows: np.ndarray) -> bool:
    return bool(np.all(rows == np.arange(len(rows))))


def _rows(signature: Signature, pads: dict[str, float], rows: int, length: int) -> Arrays:
    """`rows` rows of `length` cells along the padded dimension, of pad values (the model
    passed zeros and its pad values at load already; the values cost nothing here)."""
    batch = {}
    for info in signature.inputs:
        shape = [rows, *(max(d, 1) for d in info.shape[1:])]
        if info.name in pads:
            shape[1] = length
        fill = pads.get(info.name, 0.0)
        batch[info.name] = np.full(shape, fill, dtype=DTYPES[info.datatype])
    return batch


def _quickest(run: Run, row: Arrays) -> float:
    run(row)
    best = math.inf
    for _ in range(_TRIES):
        # The calling thread's CPU time: what other processes run meanwhile does not count.
        start = time.thread_time()
        run(row)
        best = min(best, time.thread_time() - start)
    return best
