"""The workers' records merged into one run's results, and the figures read from them."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from bench.load.codes import GO_NAMES
from bench.load.record import Record
from bench.load.schedule import Plan

SATURATED_CPU = 0.9  # of one core: a worker this busy cannot keep its schedule
LATE_SECONDS = 0.010  # open loop: sends this late (P99) mean the client fell behind
REFUSED_STREAM = "RST_STREAM with error code 7"  # HTTP/2 REFUSED_STREAM, as gRPC words it


@dataclass
class Results:
    """Every request of one run; times in nanoseconds from the run's start."""

    plan: Plan
    start_wall: float  # the run's start, seconds since the epoch
    due: np.ndarray  # when each request was due (closed loop: when it was sent)
    lag: np.ndarray  # how late the client sent it
    latency: np.ndarray  # open loop: from due to answer; closed loop: from send
    code: np.ndarray  # gRPC status code numbers
    error: np.ndarray  # index into messages, -1 for none
    flags: np.ndarray  # 1 degraded, 2 cached (v2 response parameters)
    messages: list[str]
    cpu: list[tuple[float, float]]  # per worker: CPU seconds, wall seconds
    end_reason: str

    @property
    def count(self) -> int:
        return len(self.latency)

    @property
    def ok(self) -> np.ndarray:
        return self.code == 0

    @property
    def total_seconds(self) -> float:
        """From the start to the last answer."""
        return float((self.due + self.latency).max()) / 1e9 if self.count else 0.0

    def ok_latencies(self) -> np.ndarray:
        """Latencies of answered requests, seconds, sorted."""
        return np.sort(self.latency[self.ok]) / 1e9

    def percentile_ms(self, q: float) -> float:
        ok = self.ok_latencies()
        return float(np.percentile(ok, q)) * 1e3 if len(ok) else float("nan")

    def throughput(self) -> float:
        """Answered requests per second."""
        seconds = self.total_seconds
        return float(self.ok.sum()) / seconds if seconds else 0.0

    def goodput(self, objective_seconds: float) -> float:
        """Full answers (not degraded) within the objective, per second."""
        seconds = self.total_seconds
        good = self.ok & (self.flags & 1 == 0) & (self.latency <= objective_seconds * 1e9)
        return float(good.sum()) / seconds if seconds else 0.0

    def codes(self) -> Counter[str]:
        """Requests by status code, in Go's names as ghz writes them (OK, Unavailable ...)."""
        numbers, counts = np.unique(self.code, return_counts=True)
        return Counter({GO_NAMES[int(n)]: int(c) for n, c in zip(numbers, counts, strict=True)})

    def error_counts(self) -> Counter[str]:
        indices, counts = np.unique(self.error[self.error >= 0], return_counts=True)
        return Counter(
            {self.messages[int(i)]: int(c) for i, c in zip(indices, counts, strict=True)}
        )

    def degraded(self) -> int:
        return int((self.flags & 1).astype(bool).sum())

    def cached(self) -> int:
        return int((self.flags & 2).astype(bool).sum())

    def skip_first(self, n: int) -> Results:
        """Without the first `n` answers (ghz's --skipFirst, for warm-up): the figures then
        run from the moment the n-th answer came back."""
        if n <= 0 or not self.count:
            return self
        done = self.due + self.latency
        order = np.argsort(done, kind="stable")
        origin = done[order[min(n, self.count) - 1]]
        keep = np.sort(order[n:])
        return replace(
            self,
            due=self.due[keep] - origin,
            lag=self.lag[keep],
            latency=self.latency[keep],
            code=self.code[keep],
            error=self.error[keep],
            flags=self.flags[keep],
        )

    def client(self) -> dict[str, float]:
        """The load tool's own CPU use and lateness: is the tool the bottleneck?"""
        cpu = [c / w if w else 0.0 for c, w in self.cpu]
        lag = np.percentile(self.lag, 99) / 1e9 if self.count and self.plan.open_loop else 0.0
        return {
            "workers": len(self.cpu),
            "cpuSeconds": sum(c for c, _ in self.cpu),
            "cores": sum(cpu),  # the machine's cores the tool took, its workers together
            "busiestWorkerCpu": max(cpu, default=0.0),
            "sendLagP99": float(lag),
        }

    def warnings(self) -> list[str]:
        """Why these figures may describe the load tool rather than the server."""
        client = self.client()
        out = []
        if client["busiestWorkerCpu"] >= SATURATED_CPU:
            out.append(
                f"the load tool is saturated: a worker used {client['busiestWorkerCpu']:.0%} "
                "of a core; add --workers (or lower the load) so the tool is not the "
                "bottleneck"
            )
        if client["sendLagP99"] > LATE_SECONDS:
            out.append(
                f"sends fell behind schedule (P99 {client['sendLagP99'] * 1e3:.1f} ms late): "
                "the client could not keep the arrival rate, and the lateness counts in the "
                "latencies; the machine may be out of CPU"
            )
        if any(REFUSED_STREAM in message for message in self.messages):
            out.append(
                "the server refused streams (HTTP/2 REFUSED_STREAM): more requests were in "
                "flight on one connection than it allows; add --connections"
            )
        return out


def merge(plan: Plan, start_wall: float, records: list[Record]) -> Results:
    """One Results from every worker's record."""
    where: dict[str, int] = {}
    errors = []
    for record in records:
        local = np.frombuffer(record.error, dtype=np.int32) if record.error else _empty("i4")
        table = np.array([where.setdefault(m, len(where)) for m in record.errors] or [0])
        errors.append(np.where(local >= 0, table[np.maximum(local, 0)], -1))
    messages = list(where)
    reasons = {r.end_reason for r in records}
    reason = "cancel" if "cancel" in reasons else "timeout" if "timeout" in reasons else "normal"
    return Results(
        plan=plan,
        start_wall=start_wall,
        due=_join(records, "due", "i8"),
        lag=_join(records, "lag", "i8"),
        latency=_join(records, "latency", "i8"),
        code=_join(records, "code", "i1"),
        error=np.concatenate(errors) if errors else _empty("i4"),
        flags=_join(records, "flags", "i1"),
        messages=messages,
        cpu=[(r.cpu_seconds, r.wall_seconds) for r in records],
        end_reason=reason,
    )


def _join(records: list[Record], name: str, dtype: str) -> np.ndarray:
    parts = [np.frombuffer(getattr(r, name), dtype=dtype) for r in records if len(r.latency)]
    return np.concatenate(parts) if parts else _empty(dtype)


def _empty(dtype: str) -> np.ndarray:
    return np.zeros(0, dtype=dtype)
