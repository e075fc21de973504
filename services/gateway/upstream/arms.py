"""Per-arm figures of the A/B split, for Prometheus and for the admin status."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from services.gateway.metrics import ARM_LATENCY, ARM_REQUESTS


@dataclass
class ArmFigures:
    requests: int = 0
    errors: int = 0
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=2000))

    def percentiles_ms(self) -> tuple[float, float, float]:
        if not self.latencies:
            return 0.0, 0.0, 0.0
        p50, p95, p99 = np.percentile(np.asarray(self.latencies) * 1000, [50, 95, 99])
        return float(p50), float(p95), float(p99)


class ArmBook:
    def __init__(self) -> None:
        self.figures: dict[tuple[str, str], ArmFigures] = {}

    def record(self, pipeline: str, arm: str, code: str, seconds: float, requests: int = 1) -> None:
        """`requests` answered by `arm` with `code` after `seconds` (a flight's, together)."""
        figures = self.figures.get((pipeline, arm))
        if figures is None:
            figures = self.figures[(pipeline, arm)] = ArmFigures()
        figures.requests += requests
        ARM_REQUESTS(pipeline, arm, code).inc(requests)
        if code != "OK":
            figures.errors += requests
            return
        figures.latencies.extend([seconds] * requests)
        histogram = ARM_LATENCY(pipeline, arm)
        for _ in range(requests):
            histogram.observe(seconds)

    def get(self, pipeline: str, arm: str) -> ArmFigures:
        return self.figures.get((pipeline, arm), ArmFigures())
