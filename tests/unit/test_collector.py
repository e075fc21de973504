"""strata.process.collector: start-up's objects frozen while serving, garbage among them still
freed."""

import asyncio
import gc
import weakref

from strata.process.collector import YOUNG_THRESHOLD, Frozen


class Node:
    """An object in a reference cycle: only the cyclic collector frees it."""

    def __init__(self) -> None:
        self.me = self


def test_serving_freezes_what_start_up_made_and_unfreezes_after() -> None:
    async def serving() -> int:
        with Frozen():
            return gc.get_freeze_count()

    assert asyncio.run(serving()) > 0
    assert gc.get_freeze_count() == 0


def test_serving_collects_young_objects_less_often_and_as_before_after() -> None:
    before = gc.get_threshold()

    async def serving() -> tuple[int, int, int]:
        with Frozen():
            return gc.get_threshold()

    young, *older = asyncio.run(serving())
    assert young == YOUNG_THRESHOLD > before[0]
    assert tuple(older) == before[1:]
    assert gc.get_threshold() == before


def test_garbage_in_cycles_among_frozen_objects_is_freed_at_the_next_refreeze() -> None:
    async def serving() -> tuple[bool, bool]:
        node = Node()
        alive = weakref.ref(node)
        with Frozen(refreeze_seconds=0.05):
            del node  # now garbage, but frozen: a collection does not see it
            gc.collect()
            before = alive() is not None
            await asyncio.sleep(0.2)  # a refreeze collects it
            return before, alive() is not None

    frozen_then, alive_after = asyncio.run(serving())
    assert frozen_then, "a frozen cycle outlives a collection"
    assert not alive_after, "the refreeze freed it"
