"""strata.calls.gathering: asyncio.gather's results, with no task for a lone awaitable."""

import asyncio

import pytest

from strata.calls.gathering import gather


async def _value(value: int) -> int:
    await asyncio.sleep(0)
    return value


async def _task_count_inside(value: int) -> int:
    return len(asyncio.all_tasks())


def test_results_come_in_order() -> None:
    assert asyncio.run(gather([_value(3), _value(1), _value(2)])) == [3, 1, 2]
    assert asyncio.run(gather([])) == []


def test_a_lone_awaitable_runs_in_the_callers_task() -> None:
    async def main() -> tuple[list[int], list[int]]:
        return await gather([_task_count_inside(0)]), await gather(
            [_task_count_inside(0), _task_count_inside(0)]
        )

    alone, two = asyncio.run(main())
    assert alone == [1], "only the caller's task"
    assert two[0] == 3, "the caller's and a task for each, made before either runs"


def test_the_first_error_is_raised() -> None:
    async def fails() -> int:
        raise ValueError("bad")

    with pytest.raises(ValueError):
        asyncio.run(gather([fails()]))
    with pytest.raises(ValueError):
        asyncio.run(gather([_value(1), fails()]))
