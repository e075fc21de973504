"""Steady client load for fault-injection tests, with a tally of what the clients saw."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import grpc
import numpy as np

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec

IMAGE = np.zeros((1, 8, 8), np.uint8)


@dataclass
class Outcome:
    at: float
    code: str
    seconds: float
    arm: str = ""
    cached: bool = False


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def sent(self) -> int:
        return len(self.outcomes)

    def codes(self, since: float = 0.0) -> Counter:
        return Counter(o.code for o in self.outcomes if o.at >= since)

    def worst(self) -> float:
        return max((o.seconds for o in self.outcomes), default=0.0)

    def report(self, scenario: str) -> str:
        codes = self.codes()
        failed = {k: v for k, v in codes.items() if k != "OK"}
        return (
            f"{scenario}: sent {self.sent}, ok {codes['OK']}, failed {failed}, "
            f"worst {self.worst() * 1000:.0f} ms"
        )


class SteadyLoad:
    """`threads` clients sending digits requests back to back, each with `deadline`."""

    def __init__(self, address: str, threads: int = 4, deadline: float = 3.0) -> None:
        self.tally = Tally()
        self._stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))
        self._deadline = deadline
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(threads)
        ]

    def _run(self, index: int) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            started = time.monotonic()
            request = codec.build_request("digits", {"images": IMAGE})
            metadata = (("x-client-id", f"load-{index}-{n % 16}"),)
            try:
                reply = self._stub.ModelInfer(request, metadata=metadata, timeout=self._deadline)
                parameters = reply.parameters
                outcome = Outcome(
                    started,
                    "OK",
                    0.0,
                    parameters["strata.arm"].string_param,
                    parameters["strata.cached"].bool_param,
                )
            except grpc.RpcError as exc:
                outcome = Outcome(started, exc.code().name, 0.0)
                time.sleep(0.01)  # a client backs off a little after a failure
            outcome.seconds = time.monotonic() - started
            with self._lock:
                self.tally.outcomes.append(outcome)

    def __enter__(self) -> SteadyLoad:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()
