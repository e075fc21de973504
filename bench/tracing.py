"""What tracing costs: `python -m bench.tracing [--config ...] [--rounds 2] [--duration 8]
[--ratios 1,0.1]`.

The system from the config, started once per round with tracing off (exporting nothing) and
once per sample ratio with tracing on (OTLP over gRPC to an endpoint in this process, set by
the standard `OTEL_EXPORTER_OTLP_ENDPOINT`; `telemetry.sample_ratio` of new traces sampled),
alternated; the same closed-loop client on one connection at 1 and 8 in flight against the
first pipeline with a demo data set, at 1, 8 and 64 in flight (64: about the system's
capacity). It reports throughput and P99 with tracing on over off, per ratio, concurrency
and round (issue 24's goal: tracing costs at most 10% of capacity; issue 33's: P99 at most
1.3x), and how many spans a request cost with every request sampled. Results go to `--out`
(bench/results/tracing.md).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

from bench.deployment import CountingReceiver, running
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
CONCURRENCIES = (1, 8, 64)
WARMUP_SECONDS = 2.0

# (round, sample ratio or None for tracing off, concurrency) -> (answers per second, P99 ms)
Figures = dict[tuple[int, float | None, int], tuple[float, float]]


def measure(
    config: Path, rounds: int, seconds: float, ratios: tuple[float, ...]
) -> tuple[Figures, int, float | None]:
    """Every round, tracing off, then on at each of `ratios`; the figures, how many spans
    were exported, and how many a request cost with every request sampled (None if no
    ratio was 1)."""
    settings = load_settings(config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    requests = workload(settings, name).pipeline_requests
    figures: Figures = {}
    spans = 0
    every = [0, 0]  # with every request sampled: spans, answered requests
    with LoadPool(1) as pool:
        for round_ in range(1, rounds + 1):
            for ratio in (None, *ratios):
                receiver = CountingReceiver() if ratio is not None else None
                run, answered = _run(config, pool, requests, round_, receiver, ratio, seconds)
                figures.update(run)
                exported = receiver.spans if receiver is not None else 0
                spans += exported
                if ratio == 1.0:
                    every[0] += exported
                    every[1] += answered
    return figures, spans, every[0] / every[1] if every[1] else None


def _run(
    config: Path,
    pool: LoadPool,
    requests,
    round_: int,
    receiver: CountingReceiver | None,
    ratio: float | None,
    seconds: float,
) -> tuple[Figures, int]:
    """One system start's figures, and how many requests it answered (warm-ups included:
    they were traced too)."""
    figures: Figures = {}
    answered = 0
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="strata-") as tmp:
        endpoint = None
        if receiver is not None:
            stack.enter_context(receiver)
            endpoint = f"http://127.0.0.1:{receiver.port}"
        supervisor, _ = stack.enter_context(
            running(config, Path(tmp), endpoint, sample_ratio=ratio)
        )
        plan = Plan(
            target=supervisor.address("gateway"),
            method=INFER,
            requests=requests,
            metadata=CLIENT,
            timeout=30,
            connections=1,
        )
        for concurrency in CONCURRENCIES:
            warm = closed(pool, plan, concurrency, WARMUP_SECONDS)
            results = closed(pool, plan, concurrency, seconds)
            answered += int(warm.ok.sum()) + int(results.ok.sum())
            figures[(round_, ratio, concurrency)] = (
                results.throughput(),
                results.percentile_ms(99),
            )
            print(
                f"round {round_}, {_tracing(ratio)}, c={concurrency}: "
                f"{results.throughput():.0f}/s, P99 {results.percentile_ms(99):.2f} ms",
                flush=True,
            )
    return figures, answered


def _tracing(ratio: float | None) -> str:
    return "tracing off" if ratio is None else f"tracing on, sample ratio {ratio:g}"


def report(figures: Figures, spans: int, per_request: float | None) -> str:
    lines = [
        "| round | c | sample ratio | req/s off | req/s on | on / off | P99 ms off | P99 ms on "
        "| P99 on / off |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rounds = sorted({round_ for round_, _, _ in figures})
    ratios = sorted({ratio for _, ratio, _ in figures if ratio is not None}, reverse=True)
    for round_ in rounds:
        for c in CONCURRENCIES:
            off_rate, off_p99 = figures[(round_, None, c)]
            for ratio in ratios:
                on_rate, on_p99 = figures[(round_, ratio, c)]
                lines.append(
                    f"| {round_} | {c} | {ratio:g} | {off_rate:.0f} | {on_rate:.0f} "
                    f"| {on_rate / off_rate:.2f} | {off_p99:.2f} | {on_p99:.2f} "
                    f"| {on_p99 / off_p99:.2f} |"
                )
    lines.append(f"\nSpans exported with tracing on: {spans:,}.")
    if per_request is not None:
        lines.append(f"Spans a request with every request sampled: {per_request:.2f}.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--rounds", type=int, default=2, help="alternated off/on rounds")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds a point")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument(
        "--ratios",
        type=lambda text: tuple(float(part) for part in text.split(",")),
        default=(1.0, 0.1),
        help="sample ratios to measure with tracing on, comma-separated",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 round of 1 s")
    args = parser.parse_args(argv)
    rounds, seconds = (1, 1.0) if args.quick else (args.rounds, args.duration)
    figures, spans, per_request = measure(args.config, rounds, seconds, args.ratios)
    table = report(figures, spans, per_request)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "tracing.md").write_text(f"# Tracing on against off\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
