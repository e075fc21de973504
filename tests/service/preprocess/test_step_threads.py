"""preprocess.threads: how many calls' steps one replica runs at once, and the threads the
steps' native libraries may use."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

from services.preprocess.pipeline import PreprocessPipelines
from services.preprocess.servicer import PreprocessServicer
from services.preprocess.threads import RAYON_THREADS, step_pool
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.codec import Arrays


class Overlap:
    """A stand-in pipeline whose run takes a while (releasing the GIL, as Pillow's decode
    does) and notes how many runs were under way at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._now = 0
        self.most = 0

    def for_version(self, version: str) -> Overlap:
        return self

    def run(self, tensors: Arrays) -> Arrays:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        time.sleep(0.05)
        with self._lock:
            self._now -= 1
        return tensors


@pytest.mark.parametrize("threads", [1, 3])
def test_a_replica_runs_at_most_its_threads_calls_steps_at_once(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(RAYON_THREADS, "")  # restored after: step_pool sets it
    overlap = Overlap()
    with threadpool_limits():  # the process's native limits, restored after
        pool = step_pool(threads)
    servicer = PreprocessServicer(PreprocessPipelines({"p": overlap}), pool, inline_max_bytes=0)
    tensors = codec.arrays_to_tensors({"x": np.zeros(64, np.uint8)})

    async def go() -> None:
        calls = [
            servicer.Process(
                v1.ProcessRequest(requests=[v1.Request(id=str(i), pipeline="p", tensors=tensors)]),
                None,
            )
            for i in range(6)
        ]
        for reply in await asyncio.gather(*calls):
            assert not reply.results[0].HasField("error")

    try:
        asyncio.run(go())
    finally:
        pool.shutdown()
    assert overlap.most == threads


def test_the_native_pools_are_held_to_the_threads() -> None:
    # In a process of its own: the limits hold for the whole process.
    code = (
        "import json, os, numpy, threadpoolctl\n"
        "from services.preprocess.threads import RAYON_THREADS, step_pool\n"
        "step_pool(1)\n"
        "blas = [p['num_threads'] for p in threadpoolctl.threadpool_info()]\n"
        "print(json.dumps([os.environ['RAYON_NUM_THREADS'], blas]))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rayon, blas = json.loads(done.stdout)
    assert rayon == "1"
    assert blas and set(blas) == {1}, blas  # numpy's OpenBLAS, loaded by the service
