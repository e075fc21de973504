"""Serving a bidirectional stream of calls: each message answered on its own, in the order the
answers are ready, with a bound on what one stream can make the server hold.

A message's answer is zero or more messages (a decoupled model's responses), written in
their order and together: another message's answers never fall between them.
A stream is read only as fast as it is answered: once `max_in_flight` of its messages are
unanswered (or answered but not yet all taken by the client), the server stops reading it, so
HTTP/2 flow control holds the client back instead of the server's memory. The room is one
per message, whatever its answer's length: what one message may answer with is the caller's
to bound (services/gateway/serving/decoupled.py). Once the process
is draining (SIGTERM), each new message is answered at once with the protocol's refusal
(UNAVAILABLE: the caller sends it elsewhere) while those already running finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

Req = TypeVar("Req")
Resp = TypeVar("Resp")

DEFAULT_MAX_IN_FLIGHT = 64
DRAINING_MESSAGE = "the server is shutting down; send the call to another replica"


class Drain:
    """Whether this process is draining; set once by the server on SIGTERM."""

    draining = False

    @classmethod
    def start(cls) -> None:
        cls.draining = True


async def answer_each(
    requests: AsyncIterator[Req],
    answer: Callable[[Req], Awaitable[Sequence[Resp]]],
    refuse: Callable[[Req, str], Resp],
    max_in_flight: int,
) -> AsyncIterator[Resp]:
    """Run `answer` on every message concurrently and yield each one's answers when ready.

    `answer` never raises: it turns a failure into the protocol's error answer. `refuse`
    makes the protocol's UNAVAILABLE answer for a message that arrives while draining."""
    answers: asyncio.Queue[Sequence[Resp] | None] = asyncio.Queue()
    room = asyncio.Semaphore(max_in_flight)

    async def one(request: Req) -> None:
        answers.put_nowait(await answer(request))

    async def read() -> None:
        try:
            async with asyncio.TaskGroup() as group:
                while await room.acquire():
                    request = await anext(requests, None)
                    if request is None:
                        break
                    if Drain.draining:
                        answers.put_nowait([refuse(request, DRAINING_MESSAGE)])
                    else:
                        group.create_task(one(request))
        finally:
            answers.put_nowait(None)

    reader = asyncio.create_task(read())
    try:
        while (items := await answers.get()) is not None:
            for item in items:
                yield item
            room.release()  # once per message: its last answer is taken
        await reader  # its failure (the client's stream broke) is the call's
    finally:
        reader.cancel()
