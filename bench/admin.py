"""The gateway's admin API as the benchmarks use it: pin or release the ladder, watch its level.

A watcher thread reads `strata.v1.Admin/Status` a few times a second, so a benchmark knows
the highest degradation level each load step reached and can plot the level over time.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from strata.proto.v1 import admin_pb2, admin_pb2_grpc


@dataclass(frozen=True)
class Sample:
    at: float  # time.time()
    level: int
    inflight: int


class Admin:
    """A synchronous admin client for one gateway."""

    def __init__(self, address: str, token: str) -> None:
        self._channel = grpc.insecure_channel(address)
        self._stub = admin_pb2_grpc.AdminStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),)

    def status(self) -> admin_pb2.StatusResponse:
        return self._stub.Status(admin_pb2.StatusRequest(), metadata=self._metadata, timeout=5)

    def force(self, level: int) -> None:
        """Pin the ladder at `level` (0: measure the full pipeline, never its shortcuts)."""
        request = admin_pb2.ForceLevelRequest(level=level)
        self._stub.ForceLevel(request, metadata=self._metadata, timeout=5)

    def release(self) -> None:
        """Let the ladder follow its live signals again."""
        request = admin_pb2.ForceLevelRequest(release=True)
        self._stub.ForceLevel(request, metadata=self._metadata, timeout=5)

    def wait_calm(self, timeout: float) -> bool:
        """Wait until the level is 0 with nothing in flight; False if it took too long."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                status = self.status()
            except grpc.RpcError:
                status = None  # a gateway still swamped may not answer in time; ask again
            if status is not None and status.level == 0 and status.inflight == 0:
                return True
            time.sleep(0.25)
        return False

    def close(self) -> None:
        self._channel.close()


class LevelWatch:
    """Samples the gateway's level and in-flight count every `interval` seconds."""

    def __init__(self, admin: Admin, interval: float = 0.25) -> None:
        self.samples: list[Sample] = []
        self._admin = admin
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="level-watch", daemon=True)

    def __enter__(self) -> LevelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                status = self._admin.status()
                self.samples.append(Sample(time.time(), status.level, status.inflight))
            except grpc.RpcError:
                pass  # a busy gateway may miss a sample; the next one counts
            self._stop.wait(self._interval)

    def highest(self, since: float, until: float) -> int | None:
        """The highest level sampled between two wall-clock times (None: no sample)."""
        return max((s.level for s in self.samples if since <= s.at <= until), default=None)
