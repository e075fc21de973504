"""What tracing costs: `python -m bench.tracing [--config ...] [--rounds 6] [--duration 3]
[--ratios 1,0.1]`.

One system from the config per setting, all started at once and side by side: tracing off
(exporting nothing), and tracing on at each sample ratio (OTLP over gRPC to an endpoint in
this process, set by the standard `OTEL_EXPORTER_OTLP_ENDPOINT`; `telemetry.sample_ratio` of
new traces sampled). The same closed-loop client on one connection measures each in turn
against the first pipeline with a demo data set, at 1, 8 and 64 in flight (64: about the
system's capacity), in short rounds whose order alternates, so that a noisy neighbour hits
every setting alike: on a shared machine a system's throughput moves by 10 to 25% between
starts, more than the cost measured. It reports throughput and P99 with tracing on over off
per round, and their median over the rounds, per ratio and concurrency (issue 24's goal:
tracing costs at most 10% of capacity; issue 33's: P99 at most 1.3x), and how many spans a
request cost with every request sampled. Results go to `--out` (bench/results/tracing.md).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
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
    """Every setting (tracing off, then on at each of `ratios`) measured in turn, `rounds`
    times at each concurrency; the figures, how many spans were exported, and how many a
    request cost with every request sampled (None if no ratio was 1)."""
    settings = load_settings(config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    requests = workload(settings, name).pipeline_requests
    figures: Figures = {}
    answered: dict[float | None, int] = {}
    with contextlib.ExitStack() as stack, LoadPool(1) as pool:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="strata-")))
        receivers: dict[float, CountingReceiver] = {}
        plans: dict[float | None, Plan] = {}
        for ratio in (None, *ratios):
            endpoint = None
            if ratio is not None:
                receivers[ratio] = stack.enter_context(CountingReceiver())
                endpoint = f"http://127.0.0.1:{receivers[ratio].port}"
            folder = tmp / ("off" if ratio is None else f"ratio-{ratio:g}")
            folder.mkdir()
            supervisor, _ = stack.enter_context(
                running(config, folder, endpoint, sample_ratio=ratio)
            )
            plans[ratio] = Plan(
                target=supervisor.address("gateway"),
                method=INFER,
                requests=requests,
                metadata=CLIENT,
                timeout=30,
                connections=1,
            )
            answered[ratio] = 0
        for concurrency in CONCURRENCIES:
            for ratio, plan in plans.items():
                answered[ratio] += int(closed(pool, plan, concurrency, WARMUP_SECONDS).ok.sum())
            for round_ in range(1, rounds + 1):
                order = list(plans) if round_ % 2 else list(plans)[::-1]
                for ratio in order:
                    results = closed(pool, plans[ratio], concurrency, seconds)
                    answered[ratio] += int(results.ok.sum())
                    figures[(round_, ratio, concurrency)] = (
                        results.throughput(),
                        results.percentile_ms(99),
                    )
                    print(
                        f"round {round_}, {_tracing(ratio)}, c={concurrency}: "
                        f"{results.throughput():.0f}/s, P99 {results.percentile_ms(99):.2f} ms",
                        flush=True,
                    )
        spans = {ratio: receiver.spans for ratio, receiver in receivers.items()}
    every = spans.get(1.0)
    per_request = every / answered[1.0] if every is not None and answered[1.0] else None
    return figures, sum(spans.values()), per_request


def _tracing(ratio: float | None) -> str:
    return "tracing off" if ratio is None else f"tracing on, sample ratio {ratio:g}"


def report(figures: Figures, spans: int, per_request: float | None) -> str:
    rounds = sorted({round_ for round_, _, _ in figures})
    ratios = sorted({ratio for _, ratio, _ in figures if ratio is not None}, reverse=True)
    pairs = {
        (c, ratio): [_on_over_off(figures, round_, ratio, c) for round_ in rounds]
        for c in CONCURRENCIES
        for ratio in ratios
    }
    lines = [
        f"Median over {len(rounds)} rounds of each round's on / off:",
        "",
        "| c | sample ratio | throughput on / off | range | P99 on / off | range |",
        "|---:|---:|---:|---|---:|---|",
    ]
    for (c, ratio), each in pairs.items():
        rates, p99s = [r for r, _ in each], [p for _, p in each]
        lines.append(
            f"| {c} | {ratio:g} | {statistics.median(rates):.2f} | {_span(rates)} "
            f"| {statistics.median(p99s):.2f} | {_span(p99s)} |"
        )
    lines += [
        "",
        "| round | c | sample ratio | req/s off | req/s on | on / off | P99 ms off | P99 ms on "
        "| P99 on / off |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
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


def _on_over_off(figures: Figures, round_: int, ratio: float, c: int) -> tuple[float, float]:
    """One round's throughput and P99 with tracing on at `ratio`, over tracing off's."""
    (off_rate, off_p99), (on_rate, on_p99) = figures[(round_, None, c)], figures[(round_, ratio, c)]
    return on_rate / off_rate, on_p99 / off_p99


def _span(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument(
        "--rounds", type=int, default=6, help="rounds at each concurrency, order alternating"
    )
    parser.add_argument("--duration", type=float, default=3.0, help="seconds a point")
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
