"""The peer benchmark's results: ratios, Markdown, JSON and a chart."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # no display: write files only
import matplotlib.pyplot as plt

from bench.peers.per_process import cpu_table
from bench.report import machine
from bench.suite_report import clean

if TYPE_CHECKING:
    from bench.peers.rows import Row, Timing

PEERS = ("mlserver", "kserve", "bare")
# Each server's REST target beside its gRPC one: ratio keys' prefix, REST row, gRPC row.
REST_PAIRS = (("", "pipeline-rest", "pipeline"), ("mlserver_", "mlserver-rest", "mlserver"))
REST_GOAL = 0.7  # the pipeline's REST throughput over its gRPC throughput, at the least
FULL = "full_throughput"  # what every ratio compares: full answers per second


def build(
    rows: list[Row], skipped: dict[str, str], config: Path, timing: Timing, seconds: float
) -> dict[str, Any]:
    """Everything measured, by server, with the ratios the benchmark is for."""
    servers: dict[str, Any] = {}
    for row in rows:
        entry = servers.setdefault(
            row.server, {"title": row.title, "carries": row.carries, "rows": []}
        )
        entry["rows"].append(
            {
                "concurrency": row.concurrency,
                **row.point.as_dict(),
                "full_throughput": row.full_throughput,
                "cpu_ms_per_request": row.cpu_ms,
                "cpu_ms_per_request_total": row.cpu_total_ms,
            }
        )
    return {
        "machine": machine(),
        "config": str(config),
        "timing": timing.__dict__,
        "seconds": seconds,
        "servers": servers,
        "skipped": skipped,
        "ratios": ratios(servers, timing),
    }


def _at(servers: dict[str, Any], server: str, concurrency: int) -> dict[str, Any] | None:
    rows = servers.get(server, {}).get("rows", [])
    return next((r for r in rows if r["concurrency"] == concurrency), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or not b or math.isnan(a) or math.isnan(b):
        return None
    return a / b


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def ratios(servers: dict[str, Any], timing: Timing) -> dict[str, Any]:
    """Pipeline against each peer at the top concurrency, and latencies at the bottom one; REST
    over gRPC throughput of the same server at both (`rest_over_grpc_c1`, `_c64` ...). Every
    throughput is of full answers: a degraded one (the gateway's cache or default, marked
    `strata.degraded`) never counts as work done."""
    low, high = min(timing.concurrencies), max(timing.concurrencies)

    def figure(server: str, concurrency: int, key: str) -> float | None:
        row = _at(servers, server, concurrency)
        return None if row is None else row[key]

    out: dict[str, Any] = {"low": low, "high": high}
    for peer in PEERS:
        out[f"throughput_pipeline_over_{peer}"] = _ratio(
            figure("pipeline", high, FULL), figure(peer, high, FULL)
        )
    p50, ml_p50 = figure("pipeline", low, "p50_ms"), figure("mlserver", low, "p50_ms")
    out["p50_pipeline_over_mlserver"] = _ratio(p50, ml_p50)
    out["p50_pipeline_minus_mlserver_ms"] = _minus(p50, ml_p50)
    for q in ("p50_ms", "p99_ms"):
        out[f"{q[:3]}_pipeline_minus_inference_ms"] = _minus(
            figure("pipeline", low, q), figure("inference", low, q)
        )
    for prefix, rest, grpc in REST_PAIRS:
        for c in (low, high):
            out[f"{prefix}rest_over_grpc_c{c}"] = _ratio(
                figure(rest, c, FULL), figure(grpc, c, FULL)
            )
    out["throughput_pipeline_rest_over_mlserver_rest"] = _ratio(
        figure("pipeline-rest", high, FULL), figure("mlserver-rest", high, FULL)
    )
    out["p50_pipeline_rest_over_mlserver_rest"] = _ratio(
        figure("pipeline-rest", low, "p50_ms"), figure("mlserver-rest", low, "p50_ms")
    )
    out["pipeline_cpu_ms_per_request"] = {
        str(c): figure("pipeline", c, "cpu_ms_per_request_total") for c in timing.concurrencies
    }
    return out


def _connections(count: int) -> str:
    return "one connection" if count == 1 else f"{count} connections"


def markdown(result: dict[str, Any]) -> str:
    timing = result["timing"]
    lines = [
        "# Strata against its peers",
        "",
        f"Machine: {result['machine']}. Config `{result['config']}` (ladder pinned at level 0). "
        f"The same ONNX file behind every server; closed loop, one row per request, "
        f"gRPC calls over {_connections(timing.get('connections', 1))}, "
        f"{timing['seconds']:g} s per point after {timing['warmup_seconds']:g} s of warm-up; "
        f"{result['seconds']:.0f} s in all. CPU is utime + stime of every process of the "
        "server (/proc), per answered request.",
        "",
        "Full answers/s leaves out answers the gateway marked degraded (its cache or the "
        "pipeline's default), counted beside the errors.",
        "",
        "| server | a request carries | c | full answers/s | P50 ms | P99 ms | CPU ms/req "
        "| degraded | errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for entry in result["servers"].values():
        for r in entry["rows"]:
            errors = ", ".join(f"{k} {v}" for k, v in r["errors"].items()) or "-"
            lines.append(
                f"| {entry['title']} | {entry['carries']} | {r['concurrency']} "
                f"| {r[FULL]:,.0f} | {_ms(r['p50_ms'])} | {_ms(r['p99_ms'])} "
                f"| {r['cpu_ms_per_request_total']:.2f} | {r['degraded']} | {errors} |"
            )
    lines += ["", *_processes(result), "", *_ratio_lines(result["ratios"]), ""]
    if result["skipped"]:
        lines += ["Skipped:", ""]
        lines += [f"- {server}: {why}" for server, why in result["skipped"].items()]
        lines.append("")
    return "\n".join(lines)


def _processes(result: dict[str, Any]) -> list[str]:
    measured = {
        name: {r["concurrency"]: r["cpu_ms_per_request"] for r in entry["rows"]}
        for name, entry in result["servers"].items()
    }
    return ["CPU ms per answered request, by process:", "", *cpu_table(measured)]


def _ratio_lines(r: dict[str, Any]) -> list[str]:
    low, high = r["low"], r["high"]
    per_c = r["pipeline_cpu_ms_per_request"].items()
    cpu = ", ".join(f"c={c}: {_num(ms, ' ms')}" for c, ms in per_c)
    throughput = [
        f"- pipeline / {title} throughput at c={high}: {_x(r[f'throughput_pipeline_over_{peer}'])}"
        for peer, title in (("mlserver", "MLServer"), ("kserve", "KServe"), ("bare", "bare"))
    ]
    return [
        "Ratios:",
        "",
        *throughput,
        f"- pipeline P50 vs MLServer P50 at c={low}: {_x(r['p50_pipeline_over_mlserver'])} "
        f"({_num(r['p50_pipeline_minus_mlserver_ms'], ' ms', signed=True)})",
        f"- pipeline minus inference alone at c={low}: "
        f"P50 {_num(r['p50_pipeline_minus_inference_ms'], ' ms', signed=True)}, "
        f"P99 {_num(r['p99_pipeline_minus_inference_ms'], ' ms', signed=True)}",
        f"- pipeline CPU per request, all its processes: {cpu}",
        *_rest_lines(r),
    ]


def _rest_lines(r: dict[str, Any]) -> list[str]:
    low, high = r["low"], r["high"]

    def pair(prefix: str) -> str:
        return ", ".join(f"c={c}: {_x(r[f'{prefix}rest_over_grpc_c{c}'])}" for c in (low, high))

    return [
        f"- REST / gRPC throughput, Strata pipeline: {pair('')} (goal: at least {REST_GOAL:.2f}x); "
        f"MLServer: {pair('mlserver_')}",
        f"- pipeline REST / MLServer REST: throughput at c={high} "
        f"{_x(r['throughput_pipeline_rest_over_mlserver_rest'])}, "
        f"P50 at c={low} {_x(r['p50_pipeline_rest_over_mlserver_rest'])}",
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:.2f}"


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _num(value: float | None, unit: str, signed: bool = False) -> str:
    if value is None or math.isnan(value):
        return "-"
    return f"{value:+.2f}{unit}" if signed else f"{value:.2f}{unit}"


def write(out: Path, name: str, result: dict[str, Any]) -> list[Path]:
    """NAME.md, NAME.json and NAME.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.md", out / f"{name}.json", out / f"{name}.png"]
    paths[0].write_text(markdown(result))
    paths[1].write_text(json.dumps(clean(result), indent=2) + "\n")
    plot(result, paths[2])
    return paths


def plot(result: dict[str, Any], path: Path) -> None:
    """Throughput, latency and CPU per request of every server at each concurrency."""
    servers = result["servers"]
    names = list(servers)
    concurrencies = result["timing"]["concurrencies"]
    figure, axes = plt.subplots(1, 3, figsize=(17, 5))
    width = 0.8 / max(len(concurrencies), 1)
    for i, c in enumerate(concurrencies):
        rows = [_at(servers, n, c) or {} for n in names]
        x = [k + i * width for k in range(len(names))]
        axes[0].bar(x, [r.get(FULL, 0) for r in rows], width, label=f"c={c}")
        axes[1].bar(x, [_nan(r.get("p50_ms")) for r in rows], width, label=f"P50 c={c}")
        axes[1].scatter(x, [_nan(r.get("p99_ms")) for r in rows], marker="_", s=200, color="k")
        axes[2].bar(x, [r.get("cpu_ms_per_request_total", 0) for r in rows], width, label=f"c={c}")
    titles = ("full answers/s", "latency ms (bars P50, dashes P99)", "CPU ms per request")
    for ax, title in zip(axes, titles, strict=True):
        ax.set_xticks([k + width * (len(concurrencies) - 1) / 2 for k in range(len(names))])
        ax.set_xticklabels(names, rotation=20)
        ax.set_title(title)
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend()
    axes[1].set_yscale("log")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
