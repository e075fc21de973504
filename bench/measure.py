"""The runs benchmarks are made of (closed-loop capacity, open-loop rates) and their figures."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from bench.load import LoadPool, Plan, Results
from bench.load.schedule import with_rate


@dataclass
class Point:
    """One load run's figures; latencies of answered requests, in ms."""

    label: str
    loop: str  # "open" (fixed arrival rate) or "closed" (fixed requests in flight)
    offered: float | None  # requests per second sent (open loop)
    concurrency: int | None  # requests in flight (closed loop)
    count: int
    seconds: float
    throughput: float  # answered per second
    goodput: float  # full answers within the latency objective, per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    errors: dict[str, int]  # failed requests by status code
    degraded: int  # answers the gateway marked degraded
    cached: int
    level: int | None = 0  # the highest degradation level reached (None: not read)
    messages: dict[str, int] = field(default_factory=dict)  # the commonest error messages
    warnings: list[str] = field(default_factory=list)

    @property
    def error_rate(self) -> float:
        return sum(self.errors.values()) / self.count if self.count else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "error_rate": self.error_rate}


def point(label: str, results: Results, objective_seconds: float, level: int | None = 0) -> Point:
    plan = results.plan
    codes = results.codes()
    return Point(
        label=label,
        loop="open" if plan.open_loop else "closed",
        offered=plan.rps,
        concurrency=None if plan.open_loop else plan.concurrency,
        count=results.count,
        seconds=results.total_seconds,
        throughput=results.throughput(),
        goodput=results.goodput(objective_seconds),
        p50_ms=results.percentile_ms(50),
        p95_ms=results.percentile_ms(95),
        p99_ms=results.percentile_ms(99),
        errors={code: n for code, n in sorted(codes.items()) if code != "OK"},
        degraded=results.degraded(),
        cached=results.cached(),
        level=level,
        messages=dict(results.error_counts().most_common(5)),
        warnings=results.warnings(),
    )


def closed(pool: LoadPool, plan: Plan, concurrency: int, seconds: float) -> Results:
    """`concurrency` requests always in flight for `seconds`."""
    run = replace(plan, rps=None, concurrency=concurrency, duration=seconds, total=None)
    return pool.run(run)


def opened(pool: LoadPool, plan: Plan, rps: float, seconds: float) -> Results:
    """Requests at a fixed `rps` for `seconds`, whatever the answers do."""
    return pool.run(replace(with_rate(plan, rps, seconds), concurrency=None))


def finite(value: float) -> float | None:
    """JSON has no NaN: a missing figure is null."""
    return None if value is None or math.isnan(value) else value
