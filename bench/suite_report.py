"""The suite's tables (printed and Markdown), its JSON, and its two plots."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt

from bench.measure import Point
from bench.suite_results import PipelineRun, Suite, SystemRun


def _tracing(run: SystemRun) -> str:
    return "on" if run.tracing else "off"


def _ms(value: float) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.1f}"


def _plus(later: float, earlier: float) -> str:
    if math.isnan(later) or math.isnan(earlier):
        return "-"
    return f"{later - earlier:+.1f}"


def _ratio(a: float, b: float) -> str:
    """A share as a percentage, with two significant digits below 1%."""
    if not b:
        return "-"
    percent = 100 * a / b
    return f"{percent:.0f}%" if percent >= 1 else f"{percent:.2g}%"


def _rows(suite: Suite) -> list[tuple[SystemRun, PipelineRun]]:
    return [(run, p) for run in suite.runs for p in run.pipelines]


def capacity_table(suite: Suite) -> str:
    lines = [
        "| pipeline | tracing | ceiling rows/s (batch) | ceiling at batch 1 "
        "| inference alone req/s | pipeline req/s | pipeline / ceiling | pipeline / alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for run, p in _rows(suite):
        rates = suite.ceilings[p.pipeline]
        best = max(rates, key=rates.__getitem__)
        alone, pipe = p.direct_capacity.throughput, p.pipeline_capacity.throughput
        lines.append(
            f"| {p.pipeline} | {_tracing(run)} | {rates[best]:,.0f} ({best}) "
            f"| {rates[min(rates)]:,.0f} | {alone:,.0f} "
            f"| {pipe:,.0f} | {_ratio(pipe, rates[best])} | {_ratio(pipe, alone)} |"
        )
    return "\n".join(lines)


def latency_table(suite: Suite) -> str:
    lines = [
        "| pipeline | tracing | rate/s | P50 ms alone | P50 ms pipeline | hops add P50 "
        "| P99 ms alone | P99 ms pipeline | hops add P99 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run, p in _rows(suite):
        a, b = p.direct_light, p.pipeline_light
        lines.append(
            f"| {p.pipeline} | {_tracing(run)} | {b.offered:.0f} | {_ms(a.p50_ms)} "
            f"| {_ms(b.p50_ms)} | {_plus(b.p50_ms, a.p50_ms)} | {_ms(a.p99_ms)} "
            f"| {_ms(b.p99_ms)} | {_plus(b.p99_ms, a.p99_ms)} |"
        )
    return "\n".join(lines)


def tracing_table(suite: Suite) -> str:
    off = {p.pipeline: p for run in suite.runs if not run.tracing for p in run.pipelines}
    on = {p.pipeline: (run, p) for run in suite.runs if run.tracing for p in run.pipelines}
    both = [name for name in off if name in on]
    if not both:
        return ""
    lines = [
        "| pipeline | req/s off | req/s on | on / off | light P50 ms off → on "
        "| light P99 ms off → on |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name in both:
        a, (_, b) = off[name], on[name]
        x, y = a.pipeline_capacity.throughput, b.pipeline_capacity.throughput
        lines.append(
            f"| {name} | {x:,.0f} | {y:,.0f} | {_ratio(y, x)} "
            f"| {_ms(a.pipeline_light.p50_ms)} → {_ms(b.pipeline_light.p50_ms)} "
            f"| {_ms(a.pipeline_light.p99_ms)} → {_ms(b.pipeline_light.p99_ms)} |"
        )
    spans = sum(run.spans for run in suite.runs if run.tracing)
    lines.append(f"\nWith tracing on, the services exported {spans:,} spans to the receiver.")
    return "\n".join(lines)


def sweep_table(suite: Suite) -> str:
    lines = [
        "| pipeline | tracing | offered/s | answered/s | goodput/s | P50 ms | P95 ms | P99 ms "
        "| errors | degraded | level |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ]
    for run, p in _rows(suite):
        for s in p.sweep:
            errors = ", ".join(f"{k} {_ratio(v, s.count)}" for k, v in s.errors.items()) or "-"
            lines.append(
                f"| {p.pipeline} | {_tracing(run)} | {s.offered:,.0f} ({s.label}) "
                f"| {s.throughput:,.0f} | {s.goodput:,.0f} | {_ms(s.p50_ms)} | {_ms(s.p95_ms)} "
                f"| {_ms(s.p99_ms)} | {errors} | {s.degraded} "
                f"| {'?' if s.level is None else s.level} |"
            )
    return "\n".join(lines)


def warnings(suite: Suite) -> list[str]:
    found: dict[str, None] = {}
    for _, p in _rows(suite):
        points = [p.direct_capacity, p.pipeline_capacity, p.direct_light, p.pipeline_light]
        for point in [*points, *p.sweep]:
            found.update(dict.fromkeys(f"{p.pipeline} {point.label}: {w}" for w in point.warnings))
    for run in suite.runs:
        if run.unsettled:
            found[
                f"tracing {_tracing(run)}: {run.unsettled} sweep step(s) began "
                "before the ladder had settled at level 0"
            ] = None
    return list(found)


def markdown(suite: Suite) -> str:
    parts = [
        "# Strata benchmark suite",
        f"Machine: {suite.machine}. Config `{suite.config}`, {suite.mode} mode, "
        f"{suite.seconds:.0f} s in all.",
        "## Capacity: the pipeline against its ceiling\n\n" + capacity_table(suite),
        "## Latency at light load: what the hops add\n\n" + latency_table(suite),
    ]
    tracing = tracing_table(suite)
    if tracing:
        parts.append("## Tracing on and off\n\n" + tracing)
    parts.append("## Load sweep, light to twice capacity\n\n" + sweep_table(suite))
    found = warnings(suite)
    if found:
        parts.append("## Warnings\n\n" + "\n".join(f"- {w}" for w in found))
    return "\n\n".join(parts) + "\n"


def print_tables(suite: Suite) -> None:
    print(markdown(suite), flush=True)


def write(out: Path, suite: Suite) -> list[Path]:
    """suite.md, suite.json, suite_latency.png and suite_degradation.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [
        out / n for n in ("suite.md", "suite.json", "suite_latency.png", "suite_degradation.png")
    ]
    paths[0].write_text(markdown(suite))
    data = {**clean(dataclasses.asdict(suite)), "warnings": warnings(suite)}
    paths[1].write_text(json.dumps(data, indent=2) + "\n")
    plot_latency(suite, paths[2])
    plot_levels(suite, paths[3])
    return paths


def clean(value: Any) -> Any:
    """JSON-ready: NaN becomes null; the points carry their error rates."""
    if isinstance(value, dict):
        cleaned = {str(k): clean(v) for k, v in value.items()}
        if "errors" in cleaned and "count" in cleaned:
            cleaned["error_rate"] = sum(cleaned["errors"].values()) / (cleaned["count"] or 1)
        return cleaned
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def plot_latency(suite: Suite, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(8, 5))
    for run, p in _rows(suite):
        shown: list[Point] = [s for s in p.sweep if not math.isnan(s.p99_ms)]
        if not shown:
            continue
        x = [s.throughput for s in shown]
        label = f"{p.pipeline}, tracing {_tracing(run)}"
        (line,) = axes.plot(x, [s.p99_ms for s in shown], marker="o", label=label)
        axes.plot(x, [s.p50_ms for s in shown], linestyle=":", color=line.get_color())
    axes.set_yscale("log")
    axes.set_xlabel("answered requests per second")
    axes.set_ylabel("latency, ms (solid P99, dotted P50)")
    axes.set_title("Pipelines through the gateway: latency against throughput")
    axes.grid(True, which="both", alpha=0.3)
    if axes.lines:
        axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def plot_levels(suite: Suite, path: Path) -> None:
    runs = suite.runs or []
    figure, panels = plt.subplots(
        len(runs) or 1, 1, figsize=(9, 3 * max(len(runs), 1)), squeeze=False
    )
    for axes, run in zip(panels[:, 0], runs, strict=False):
        times = [s.at - run.began for s in run.timeline]
        axes.step(times, [s.level for s in run.timeline], where="post", color="tab:red")
        axes.set_ylim(-0.2, 4.4)
        axes.set_ylabel("degradation level")
        axes.set_title(f"tracing {_tracing(run)}: the ladder during the run")
        offered = axes.twinx()
        for step in run.steps:
            offered.hlines(step.offered, step.start, step.end, color="tab:blue")
            axes.axvspan(step.start, step.end, color="tab:blue", alpha=0.06)
        offered.set_ylim(bottom=0)
        offered.set_ylabel("offered requests/s (blue)")
        axes.set_xlabel("seconds since the system was up")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
