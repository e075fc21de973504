"""The report as a person reads it (ghz's summary layout), and a progress bar for terminals."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

BAR = "∎"
BAR_WIDTH = 40


def duration(ns: float) -> str:
    """A duration in ns, in the unit ghz would print it in."""
    if ns >= 1e9:
        return f"{ns / 1e9:.2f} s"
    if ns >= 1e6:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e3:.2f} µs"


def summary(report: dict[str, Any]) -> str:
    """ghz's summary: totals, histogram, latency distribution, codes, errors; then the tool's."""
    lines = [
        "",
        "Summary:",
        *(f"  {k + ':':<14}{v}" for k, v in _totals(report)),
        "",
        *_histogram(report.get("histogram") or []),
        *_distribution(report.get("latencyDistribution") or []),
        "Status code distribution:",
        *_counted(report["statusCodeDistribution"], "responses"),
    ]
    if report["errorDistribution"]:
        lines += ["", "Error distribution:"]
        errors = sorted(report["errorDistribution"].items(), key=lambda kv: -kv[1])
        lines += [f"  [{count}]   {message}" for message, count in errors[:20]]
        if len(errors) > 20:
            lines.append(f"  ... and {len(errors) - 20} more distinct errors")
    lines += ["", *_client(report["strata"]), ""]
    return "\n".join(lines)


def _totals(report: dict[str, Any]) -> list[tuple[str, str]]:
    extras = report["strata"]
    rows = [
        ("Count", str(report["count"])),
        ("Total", duration(report["total"])),
        ("Slowest", duration(report["slowest"])),
        ("Fastest", duration(report["fastest"])),
        ("Average", duration(report["average"])),
        ("Requests/sec", f"{report['rps']:.2f}"),
    ]
    if extras["loop"] == "open":
        rows.append(("Offered/sec", f"{extras['offeredRps']:.2f} (open loop)"))
    if extras["degraded"] or extras["cached"]:
        rows.append(("Degraded", f"{extras['degraded']} ({extras['cached']} from cache)"))
    return rows


def _histogram(buckets: list[dict[str, Any]]) -> list[str]:
    if not buckets:
        return []
    top = max(b["count"] for b in buckets) or 1
    lines = ["Response time histogram:"]
    for b in buckets:
        bar = BAR * round(b["count"] / top * BAR_WIDTH)
        lines.append(f"  {b['mark'] * 1e3:10.3f} [{b['count']}]\t|{bar}")
    return [*lines, ""]


def _distribution(points: list[dict[str, int]]) -> list[str]:
    if not points:
        return []
    lines = ["Latency distribution:"]
    lines += [f"  {p['percentage']} % in {duration(p['latency'])}" for p in points]
    return [*lines, ""]


def _counted(counts: dict[str, int], noun: str) -> list[str]:
    width = max((len(k) for k in counts), default=0) + 2
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    return [f"  {'[' + k + ']':<{width}}   {v} {noun}" for k, v in ordered]


def _client(extras: dict[str, Any]) -> list[str]:
    client = extras["client"]
    line = (
        f"Load tool: {extras['sender']} sender, {client['workers']} worker(s), "
        f"{client['cpuSeconds']:.2f} CPU s "
        f"({client['cores']:.2f} cores), busiest worker {client['busiestWorkerCpu']:.0%} of a core"
    )
    if extras["loop"] == "open":
        line += f", send lag P99 {client['sendLagP99'] * 1e3:.2f} ms"
    return [line, *(f"WARNING: {w}" for w in extras["warnings"])]


class ProgressBar:
    """A one-line bar redrawn in place; silent unless stdout is a terminal."""

    def __init__(self, expected: int | None, seconds: float | None, out: TextIO = sys.stderr):
        self.expected = expected
        self.seconds = seconds
        self.out = out
        self.enabled = sys.stdout.isatty() and out.isatty()
        self._drawn = 0.0

    def update(self, done: int, elapsed: float) -> None:
        now = time.monotonic()
        if not self.enabled or now - self._drawn < 0.1:
            return
        self._drawn = now
        if self.expected:
            fraction = done / self.expected
        elif self.seconds:
            fraction = elapsed / self.seconds
        else:
            fraction = 0.0
        fraction = min(max(fraction, 0.0), 1.0)
        filled = int(fraction * BAR_WIDTH)
        bar = "█" * filled + "░" * (BAR_WIDTH - filled)
        self.out.write(f"\r{bar} {fraction:4.0%}  {done} done  {max(elapsed, 0):.1f}s")
        self.out.flush()

    def finish(self) -> None:
        if self.enabled:
            self.out.write("\r\033[K")
            self.out.flush()
