"""Python's cyclic garbage collector, kept off the tail of a serving process's latency.

A full collection walks every object the collector tracks. A service's start-up leaves about
70,000 of them (modules, protobuf descriptors, the config, the models' sessions), and walking
them took 20-40 ms of CPU on a 2-core VM: a pause of the event loop that every request in
flight waited out, every few seconds under load. Once a service serves, `Frozen` moves what
start-up made out of the collector's sight (gc.freeze), so a full collection walks only what
was made since. Frozen objects freed by reference counting go as ever; garbage in reference
cycles among them (a model swapped out, a replaced config) would stay, so every
`REFREEZE_SECONDS` they are handed back, collected once, and frozen again.

In a service forked from the zygote (strata.process.zygote) the frozen objects include the
zygote's, shared with its siblings page by page. gc.unfreeze() has no way to hand back only
this process's, so the first refreeze writes to each of the zygote's objects once and the
service then holds its own copy of their pages: measured on configs/default.yaml, the
deployment's PSS went from 236 MB at ready to 296 MB after it (one copy each, once), against
345 MB with every service in an interpreter of its own.

While serving, a young collection waits for `YOUNG_THRESHOLD` new objects instead of Python's
700. A request's objects (its coroutines' frames, futures, messages' wrappers, dicts) live
only while it is answered, and at the default a burst of a few requests set off a collection
that walked every request in flight and moved them to the older generations, to be walked
again there: py-spy put gc_collect_main at 0.7-3.9% of the gateway's samples at 16 digits
requests in flight on a 2-core VM, and at none of them with 10,000. A cycle of garbage waits
at most 10,000 allocations longer to be freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

REFREEZE_SECONDS = 600.0
YOUNG_THRESHOLD = 10_000  # new objects between young collections while serving


def freeze() -> None:
    """Collect what is garbage now, then freeze everything left."""
    gc.collect()
    gc.freeze()


class Frozen:
    """While entered (from a running event loop): start-up's objects frozen, and refrozen
    every `refreeze_seconds` with the garbage among them collected, and young collections
    `YOUNG_THRESHOLD` new objects apart; on exit, unfrozen, at Python's thresholds again."""

    def __init__(self, refreeze_seconds: float = REFREEZE_SECONDS) -> None:
        self._every = refreeze_seconds
        self._task: asyncio.Task[None] | None = None
        self._thresholds = gc.get_threshold()

    def __enter__(self) -> Frozen:
        freeze()
        gc.set_threshold(YOUNG_THRESHOLD, *self._thresholds[1:])
        self._task = asyncio.get_running_loop().create_task(self._refreeze())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        gc.set_threshold(*self._thresholds)
        gc.unfreeze()

    async def _refreeze(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self._every)
                gc.unfreeze()
                freeze()
