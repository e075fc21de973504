"""The batching benchmark's results: a printed table, Markdown and JSON, and a plot."""

from __future__ import annotations

import json
import math
import os
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt
import onnxruntime

from bench.ceiling import Ceiling


@dataclass
class Row:
    """One policy at one offered load."""

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
        "| policy | offered/s | answered/s | P50 ms | P95 ms | P99 ms | mean batch "
        "| refused | of ceiling |\n|---|---:|---:|---:|---:|---:|---:|---|---:|"
    )
    lines = [head]
    for r in rows:
        refused = ", ".join(f"{k} {v}" for k, v in sorted(r.refused.items())) or "-"
        lines.append(
            f"| {r.policy} | {r.offered:.0f} | {r.throughput:.0f} | {_ms(r.p50_ms)} | "
            f"{_ms(r.p95_ms)} | {_ms(r.p99_ms)} | {r.mean_batch:.1f} | {refused} | "
            f"{r.ceiling_ratio:.1%} |"
        )
    return "\n".join(lines)


def _ms(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def summary(model: str, ceiling: Ceiling, workers: int) -> str:
    sizes = ", ".join(f"{b}: {r:,.0f}" for b, r in ceiling.rows_per_second.items())
    return (
        f"Model `{model}`. In-process ONNX Runtime ceiling ({workers} threads, one session): "
        f"{ceiling.best:,.0f} rows/s at batch {ceiling.best_batch} (rows/s by batch: {sizes})."
    )


def write(out: Path, model: str, ceiling: Ceiling, workers: int, rows: list[Row]) -> list[Path]:
    """batching.md, batching.json and batching.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    text = f"# Batching benchmark\n\n{machine()}\n\n{summary(model, ceiling, workers)}\n\n"
    paths = [out / "batching.md", out / "batching.json", out / "batching.png"]
    paths[0].write_text(text + table(rows) + "\n")
    data = {
        "machine": machine(),
        "model": model,
        "ceiling_rows_per_second": {str(k): v for k, v in ceiling.rows_per_second.items()},
        "rows": [asdict(r) for r in rows],
    }
    paths[1].write_text(json.dumps(data, indent=2, allow_nan=True) + "\n")
    plot(rows, model, ceiling, paths[2])
    return paths


def plot(rows: list[Row], model: str, ceiling: Ceiling, path: Path) -> None:
    figure, axes = plt.subplots(figsize=(8, 5))
    for policy in dict.fromkeys(r.policy for r in rows):
        mine = [r for r in rows if r.policy == policy and not math.isnan(r.p99_ms)]
        (line,) = axes.plot(
            [r.throughput for r in mine], [r.p99_ms for r in mine], marker="o", label=policy
        )
        axes.plot(
            [r.throughput for r in mine],
            [r.p50_ms for r in mine],
            linestyle=":",
            color=line.get_color(),
        )
    axes.set_yscale("log")
    axes.set_xlabel("answered requests per second")
    axes.set_ylabel("latency, ms (solid P99, dotted P50)")
    axes.set_title(f"{model}: latency against throughput (ceiling {ceiling.best:,.0f} rows/s)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
