"""The in-process ONNX Runtime ceiling: rows per second with no server in the way.

The same session options the service uses, one session run by as many threads as the service
has workers, at each batch size from 1 to the max batch size; the best is the ceiling.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.inference.manifest import ModelSpec
from services.inference.model import open_session
from strata.wire.codec import Arrays


@dataclass(frozen=True)
class Ceiling:
    """Rows per second at each batch size, in process."""

    rows_per_second: dict[int, float]  # batch size -> rows per second

    @property
    def best_batch(self) -> int:
        return max(self.rows_per_second, key=self.rows_per_second.__getitem__)

    @property
    def best(self) -> float:
        return self.rows_per_second[self.best_batch]


def batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two up to the max batch size, and the max itself."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return [*sizes, max_batch_size]


def tile(sample: Arrays, rows: int) -> Arrays:
    """`sample` repeated along the batch dimension to `rows` rows."""
    return {k: np.take(v, np.arange(rows) % len(v), axis=0) for k, v in sample.items()}


def measure(folder: Path, spec: ModelSpec, sample: Arrays, threads: int, seconds: float) -> Ceiling:
    """Rows per second at each batch size, `threads` threads sharing one session."""
    session = open_session(folder / "model.onnx", spec.session)
    names = [o.name for o in session.get_outputs()]
    rates = {}
    for rows in batch_sizes(spec.max_batch_size):
        batch = tile(sample, rows)
        session.run(names, batch)
        runs = _runs_per_second(lambda b=batch: session.run(names, b), threads, seconds)
        rates[rows] = rows * runs
    return Ceiling(rates)


def _runs_per_second(call, threads: int, seconds: float) -> float:
    counts = [0] * threads
    end = time.perf_counter() + seconds

    def loop(i: int) -> None:
        while time.perf_counter() < end:
            call()
            counts[i] += 1

    start = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - start)
