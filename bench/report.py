"""The batching benchmark's results: a printed table, Markdown and JSON, and a plot."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt
import onnxruntime

from bench.ceiling import Ceiling
from strata.proto.inference import grpc_service_pb2 as v2


@dataclass(frozen=True)
class Plan:
    """How long and at what loads the benchmark measures."""

    seconds: float  # per offered load and policy
    fractions: tuple[float, ...]  # offered loads, as fractions of the probed capacity
    ceiling_seconds: float  # per batch size
    probe_seconds: float


@dataclass
class Row:
    """One policy at one offered load."""

    model: str
    policy: str
    offered: float  # requests per second
    throughput: float  # answered requests per second
    p50_ms: float
    p95_ms: float
    p99_ms: float
    answered: int
    refused: dict[str, int]  # status code -> requests
    mean_batch: float
    ceiling_ratio: float  # throughput / in-process ceiling (rows per second)


@dataclass
class Measured:
    """Everything measured for one model."""

    model: str
    ceiling: Ceiling
    workers: int
    request: v2.ModelInferRequest
    capacity: float = 0.0  # closed-loop answers per second, adaptive policy
    rows: list[Row] = field(default_factory=list)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}, "
        f"ONNX Runtime {onnxruntime.__version__}"
    )


def table(rows: list[Row]) -> str:
    head = (
        "| model | policy | offered/s | answered/s | P50 ms | P95 ms | P99 ms | mean batch "
        "| refused | of ceiling |\n|---|---|---:|---:|---:|---:|---:|---:|---|---:|"
    )
    lines = [head]
    for r in rows:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r.refused.items())) or "-"
        lines.append(
            f"| {r.model} | {r.policy} | {r.offered:.0f} | {r.throughput:.0f} | "
            f"{_ms(r.p50_ms)} | {_ms(r.p95_ms)} | {_ms(r.p99_ms)} | {r.mean_batch:.1f} | "
            f"{refused} | {r.ceiling_ratio:.2%} |"
        )
    return "\n".join(lines)


def digest(rows: list[Row]) -> str:
    """Per policy: the most it answered at any load, and its latency at the lightest load."""
    lines = [
        "| model | policy | peak answered/s | of ceiling | lightest load: P50 ms | P99 ms |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy]
        peak, light = max(mine, key=lambda r: r.throughput), min(mine, key=lambda r: r.offered)
        lines.append(
            f"| {peak.model} | {policy} | {peak.throughput:.0f} | {peak.ceiling_ratio:.2%} | "
            f"{_ms(light.p50_ms)} | {_ms(light.p99_ms)} |"
        )
    return "\n".join(lines)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def summary(result: Measured) -> str:
    sizes = ", ".join(f"{b}: {r:,.0f}" for b, r in result.ceiling.rows_per_second.items())
    return (
        f"`{result.model}`: in-process ONNX Runtime ceiling ({result.workers} threads, one "
        f"session) {result.ceiling.best:,.0f} rows/s at batch {result.ceiling.best_batch} "
        f"(rows/s by batch size: {sizes}); service capacity probed closed-loop (64 in flight, "
        f"adaptive): {result.capacity:,.0f} requests/s."
    )


def write(out: Path, results: list[Measured], plan: Plan) -> list[Path]:
    """batching.md, batching.json and batching.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "batching.md", out / "batching.json", out / "batching.png"]
    text = [f"# Batching benchmark\n\n{machine()}; {plan.seconds:g} s per point.\n"]
    for result in results:
        text += [summary(result), "", digest(result.rows), "", table(result.rows), ""]
    paths[0].write_text("\n".join(text))
    data = {
        "machine": machine(),
        "seconds_per_point": plan.seconds,
        "models": {
            r.model: {
                "ceiling_rows_per_second": {
                    str(size): rate for size, rate in r.ceiling.rows_per_second.items()
                },
                "capacity": r.capacity,
                "rows": [asdict(row) for row in r.rows],
            }
            for r in results
        },
    }
    paths[1].write_text(json.dumps(data, indent=2) + "\n")
    plot(results, paths[2])
    return paths


def plot(results: list[Measured], path: Path) -> None:
    figure, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 5), squeeze=False)
    for ax, result in zip(axes[0], results, strict=True):
        for policy in dict.fromkeys(r.policy for r in result.rows):
            mine = [r for r in result.rows if r.policy == policy and not math.isnan(r.p99_ms)]
            x = [r.throughput for r in mine]
            (line,) = ax.plot(x, [r.p99_ms for r in mine], marker="o", label=policy)
            ax.plot(x, [r.p50_ms for r in mine], linestyle=":", color=line.get_color())
        ax.set_yscale("log")
        ax.set_xlabel("answered requests per second")
        ax.set_ylabel("latency, ms (solid P99, dotted P50)")
        ax.set_title(f"{result.model} (ceiling {result.ceiling.best:,.0f} rows/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
