"""strata.calls.streams.answer_each: a message's zero or more answers written together and in
order, and the stream's bound counted in messages, whatever their answers' lengths."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from strata.calls.streams import answer_each


class Source:
    """An endless stream of numbered messages that counts how many the server read."""

    def __init__(self, count: int | None = None) -> None:
        self.read = 0
        self.count = count

    def __aiter__(self) -> AsyncIterator[int]:
        return self

    async def __anext__(self) -> int:
        if self.count is not None and self.read == self.count:
            raise StopAsyncIteration
        self.read += 1
        return self.read - 1


def refuse(message: int, detail: str) -> str:
    return f"{message}: refused"


def test_each_message_gets_its_answers_together_and_in_order() -> None:
    lengths = {0: 3, 1: 0, 2: 1}

    async def answer(message: int) -> list[str]:
        await asyncio.sleep(0.01 * (3 - message))  # the last message is ready first
        return [f"{message}.{i}" for i in range(lengths[message])]

    async def go() -> list[str]:
        return [item async for item in answer_each(Source(3), answer, refuse, 8)]

    assert asyncio.run(go()) == ["2.0", "0.0", "0.1", "0.2"]


def test_the_bound_counts_messages_not_their_answers() -> None:
    """Five answers each, room for two messages: the server reads two, and taking all of
    the first one's answers lets it read one more, not five."""

    async def answer(message: int) -> list[str]:
        return [f"{message}.{i}" for i in range(5)]

    async def go() -> tuple[int, int, list[str]]:
        source = Source()
        stream = answer_each(source, answer, refuse, 2)
        taken = [await anext(stream)]
        await asyncio.sleep(0.05)
        before = source.read
        taken += [await anext(stream) for _ in range(4)]  # the first message's last answer
        taken.append(await anext(stream))  # the room it left is given back before this
        await asyncio.sleep(0.05)
        after = source.read
        await stream.aclose()
        return before, after, taken

    before, after, taken = asyncio.run(go())
    assert before == 2
    assert after == 3
    assert taken == ["0.0", "0.1", "0.2", "0.3", "0.4", "1.0"]


def test_a_message_with_no_answers_gives_its_room_back() -> None:
    async def answer(message: int) -> list[str]:
        return [] if message < 10 else ["last"]

    async def go() -> list[str]:
        return [item async for item in answer_each(Source(11), answer, refuse, 1)]

    assert asyncio.run(go()) == ["last"]
