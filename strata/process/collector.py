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
"""

from __future__ import annotations

import asyncio
import contextlib
import gc

REFREEZE_SECONDS = 600.0


def freeze() -> None:
    """Collect what is garbage now, then freeze everything left."""
    gc.collect()
    gc.freeze()


class Frozen:
    """While entered (from a running event loop): start-up's objects frozen, and refrozen
    every `refreeze_seconds` with the garbage among them collected; on exit, unfrozen."""

    def __init__(self, refreeze_seconds: float = REFREEZE_SECONDS) -> None:
        self._every = refreeze_seconds
        self._task: asyncio.Task[None] | None = None

    def __enter__(self) -> Frozen:
        freeze()
        self._task = asyncio.get_running_loop().create_task(self._refreeze())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
        gc.unfreeze()

    async def _refreeze(self) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            while True:
                await asyncio.sleep(self._every)
                gc.unfreeze()
                freeze()
