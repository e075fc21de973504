"""A hop's own timeout, from how long that hop normally takes for the work a call carries.

The caller's deadline says how long the caller will wait, not how long the next layer should
take: a hung process would hold every request sent to it until their callers give up. So each
hop's calls get `multiplier` times what its recent calls took (never less than
`floor_seconds`, never more than `upstream_timeout_seconds`); a call that misses it is the
hop's failure (UNAVAILABLE: the breaker counts it and the flight fails over while its budget
lasts).

What a call took is learned for what it carried, not per call: a flight of 16 photos takes
about 16 times one photo's time, and a timeout learned from lone photos must not fail it. Each
answered call gives its seconds per call, per row and per byte; a call's timeout is the
multiple of the largest of the recent P99 per call, the P99 per row times its rows and the
P99 per byte times its bytes, plus that of the calls the hop still owes answers to (a call
sent while a flight of 16 is being served waits for it). Calls are timed apart by what they
are for (the pipeline of a preprocess or postprocess call, the model of an inference call):
one hop serves light and heavy pipelines, and the light one's times say nothing of the heavy
one's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from strata.config.gateway import HopTimeouts
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import stack

RECOMPUTE_EVERY = 32  # answered calls between two P99 estimates


@dataclass(frozen=True)
class Load:
    """What one call carries: what it is for, its rows and its tensors' bytes."""

    kind: str = ""
    rows: int = 1
    bytes: int = 0

    @classmethod
    def of(cls, request: object) -> Load:
        """The load of a strata.v1 Process or v2 ModelInfer request (another: one row)."""
        if isinstance(request, v2.ModelInferRequest):
            inputs = request.inputs
            shape = inputs[0].shape if inputs else []
            size = sum(_v2_size(request, i, tensor) for i, tensor in enumerate(inputs))
            return cls(request.model_name, int(shape[0]) if shape else 1, size)
        if isinstance(request, v1.ProcessRequest) and request.requests:
            rows = sum(_rows(item) for item in request.requests)
            size = sum(stack.tensor_size(t) for item in request.requests for t in item.tensors)
            return cls(request.requests[0].pipeline, rows, size)
        return cls()


def _v2_size(
    request: v2.ModelInferRequest, index: int, tensor: v2.ModelInferRequest.InferInputTensor
) -> int:
    """Input `index`'s bytes, without copying its raw contents where its shape says."""
    raw = request.raw_input_contents
    if index >= len(raw):  # typed contents: not a message the gateway sends
        return 0
    return stack.size(tensor.datatype, tensor.shape, lambda: raw[index])


def _rows(item: v1.Request) -> int:
    if item.members:
        return sum(m.rows for m in item.members)
    shape = item.tensors[0].shape if item.tensors else []
    return int(shape[0]) if shape else 1


class _Window:
    """Recent answered calls of one kind: seconds per call, per row and per byte, and their
    P99s once enough are seen."""

    def __init__(self, size: int) -> None:
        self._seconds = np.zeros((3, size))  # per call, per row, per byte
        self._seen = 0
        self.p99: tuple[float, float, float] | None = None

    def add(self, seconds: float, load: Load) -> None:
        column = self._seen % self._seconds.shape[1]
        self._seconds[:, column] = (
            seconds,
            seconds / max(load.rows, 1),
            seconds / max(load.bytes, 1),
        )
        self._seen += 1

    def due(self, min_samples: int) -> bool:
        return self._seen >= min_samples and self._seen % RECOMPUTE_EVERY == 0

    def estimate(self, min_samples: int) -> None:
        if self._seen < min_samples:
            self.p99 = None
            return
        recent = self._seconds[:, : min(self._seen, self._seconds.shape[1])]
        call, row, byte = np.percentile(recent, 99, axis=1)
        self.p99 = (float(call), float(row), float(byte))


@dataclass(frozen=True)
class Timing:
    """One call's own timeout, and the P99 share of it that is its own work (0: not known)."""

    load: Load
    timeout: float
    usual: float


class HopTimer:
    """A hop's own timeouts: `multiplier` times what a call waits behind at its replica, the
    usual seconds of the calls sent and not yet answered; where each replica is sent at most
    `held` messages at once (lanes.py's Spread), a call waits behind no more than `held`
    calls' worth, however many the hop has in the air: so calls stuck at a hung replica do not
    stretch the timeouts of calls sent after them."""

    def __init__(self, settings: HopTimeouts, ceiling: float, held: int = 0) -> None:
        self.settings = settings
        self.ceiling = ceiling
        self.held = held
        self._windows: dict[str, _Window] = {}
        self._owed = 0.0  # the usual seconds of the calls sent and not yet answered

    def begin(self, load: Load, bounded: bool = True, at_least: float = 0.0) -> Timing:
        """A call carrying `load` is sent: its timeout (the ceiling unless `bounded`: no other
        replica or arm could answer it), `at_least` that long (a retry's); `end` it once it is
        over, answered or not."""
        usual = self._usual(load)
        self._owed += usual
        if not bounded or not usual:
            return Timing(load, self.ceiling, usual)
        owed = min(self._owed, usual * self.held) if self.held else self._owed
        waits = max(self.settings.multiplier * owed, at_least)
        return Timing(load, min(self.ceiling, max(self.settings.floor_seconds, waits)), usual)

    def end(self, timing: Timing) -> None:
        self._owed = max(self._owed - timing.usual, 0.0)

    def _usual(self, load: Load) -> float:
        """The P99 of recent calls of its kind, scaled to `load` (0: too few seen)."""
        window = self._windows.get(load.kind)
        if window is None or window.p99 is None:
            return 0.0
        call, row, byte = window.p99
        return max(call, row * load.rows, byte * load.bytes)

    def observe(self, seconds: float, load: Load) -> None:
        """An answered call's latency, and what it carried."""
        window = self._windows.get(load.kind)
        if window is None:
            window = self._windows[load.kind] = _Window(self.settings.window)
        window.add(seconds, load)
        if window.due(self.settings.min_samples):
            window.estimate(self.settings.min_samples)

    def configure(self, settings: HopTimeouts, ceiling: float) -> None:
        if settings.window != self.settings.window:
            self._windows = {}
        self.settings, self.ceiling = settings, ceiling
        for window in self._windows.values():
            window.estimate(settings.min_samples)
