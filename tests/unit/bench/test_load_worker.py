"""A worker's run, with its senders stubbed: every connection takes its turn, and every
request is sent and recorded."""

import asyncio
import threading
import time
from collections import Counter

import pytest

from bench.load.clients import Outcome, Send
from bench.load.schedule import Job, Plan, split
from bench.load.worker import Record, Runner

PLAN = Plan(
    target="127.0.0.1:1",
    method="/inference.GRPCInferenceService/ModelInfer",
    requests=(b"a", b"b", b"c"),
    connections=8,
    concurrency=16,
    total=64,
)


def counting(counts: Counter, index: int) -> Send:
    async def send(message: bytes) -> Outcome:
        counts[index] += 1
        await asyncio.sleep(0)
        return 0, None, 0

    return send


async def run(job: Job, sends: list[Send]) -> Record:
    return await Runner(job, sends, 0, [0], threading.Event()).run(time.time())


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_worker_spreads_its_requests_over_all_its_connections(workers: int) -> None:
    for job in split(PLAN, workers):
        counts: Counter = Counter()
        sends = [counting(counts, k) for k in range(job.connections)]
        record = asyncio.run(run(job, sends))
        assert sum(counts.values()) == len(record.code) == job.count
        assert set(counts) == set(range(job.connections)), (workers, counts)
        assert max(counts.values()) - min(counts.values()) <= 1
