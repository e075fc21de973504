"""The shadow route: copies of requests go to a mirror deployment, off the request's path.

A pipeline's first model and each of its later stages may have one (a stage's gets the rows
the stage ran, as its arm got them). The primary answer is returned at once; the mirror's
answer is only compared with it (same top class per row, or all values within tolerance)
and counted, under the pipeline's name for its first model and `<pipeline>/<stage>` for a
stage. At most `max_inflight` shadow calls run at once, all shadows together; beyond that
copies are dropped, never queued.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.gateway.metrics import SHADOW
from services.gateway.upstream.upstreams import Upstreams
from strata.config.pipelines import ModelRef, Shadow
from strata.errors import StrataError
from strata.wire import codec
from strata.wire.codec import Arrays
from strata.wire.deadline import Deadline

log = logging.getLogger(__name__)


def agree(primary: Arrays, mirror: Arrays) -> bool:
    """Same top class per row for 2-D score outputs; otherwise values within tolerance."""
    for name, ours in primary.items():
        theirs = mirror.get(name)
        if theirs is None or theirs.shape != ours.shape:
            return False
        if ours.ndim == 2 and ours.dtype.kind == "f":
            if not np.array_equal(ours.argmax(axis=1), theirs.argmax(axis=1)):
                return False
        elif not np.allclose(ours, theirs, rtol=1e-3, atol=1e-5):
            return False
    return True


@dataclass
class ShadowStats:
    compared: int = 0
    agreed: int = 0
    errors: int = 0
    dropped: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=1000))


@dataclass(frozen=True)
class Copy:
    """One request's call of `model` to mirror to `shadow` (the model's), counted under
    `name`: its inputs (`features`) and the answer it got (`primary`), by its deadline."""

    name: str
    model: ModelRef
    shadow: Shadow
    features: Arrays
    primary: Arrays
    deadline: Deadline


class ShadowRunner:
    def __init__(self, upstreams: Upstreams, max_inflight: int = 16) -> None:
        self._up = upstreams
        self._max_inflight = max_inflight
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats: dict[str, ShadowStats] = {}

    def submit(self, copy: Copy) -> None:
        """Mirror `copy` to its shadow; returns at once."""
        stats = self.stats.setdefault(copy.name, ShadowStats())
        if len(self._tasks) >= self._max_inflight:
            stats.dropped += 1
            SHADOW.labels(copy.name, "dropped").inc()
            return
        task = asyncio.create_task(self._run(copy, stats))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, copy: Copy, stats: ShadowStats) -> None:
        name, model, shadow = copy.name, copy.model, copy.shadow
        hop = self._up.inference[shadow.deployment]
        version = shadow.version or model.version
        request = codec.build_request(model.name, copy.features, version)
        started = time.monotonic()
        try:
            reply = await hop.call("ModelInfer", request, copy.deadline)
        except StrataError as exc:
            stats.errors += 1
            SHADOW.labels(name, "error").inc()
            log.debug("shadow call for %s failed: %s", name, exc)
            return
        stats.latencies.append(time.monotonic() - started)
        stats.compared += 1
        same = agree(copy.primary, codec.response_outputs(reply))
        stats.agreed += same
        SHADOW.labels(name, "agree" if same else "disagree").inc()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
