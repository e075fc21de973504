"""What the peer benchmark measures: its timing, and one server at one concurrency."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.measure import Point


@dataclass(frozen=True)
class Timing:
    concurrencies: tuple[int, ...]  # closed loop: requests in flight, one row each
    seconds: float  # per measured point
    warmup_seconds: float  # at the same concurrency, before each point
    connections: int = 1  # gRPC connections the calls share (REST: one a call in flight)


FULL = Timing((1, 64), 10.0, 2.0)
QUICK = Timing((1, 8), 2.0, 0.5)


@dataclass
class Row:
    """One server at one concurrency."""

    server: str
    title: str
    carries: str
    concurrency: int
    point: Point
    cpu_ms: dict[str, float] = field(default_factory=dict)  # per answered request, by process

    @property
    def cpu_total_ms(self) -> float:
        return sum(self.cpu_ms.values())

    @property
    def full_throughput(self) -> float:
        """Full answers per second: the answered less those the gateway marked degraded
        (from its cache or the pipeline's default), which no client asked for."""
        p = self.point
        return p.throughput - (p.degraded / p.seconds if p.seconds else 0.0)
