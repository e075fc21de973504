"""Preprocess replicas side by side: `python -m bench.image_chain --replicas 1,2 [--threads 1]`.

The image chain (bench.image_chain) started once for each variant, a count of preprocess
replicas with a `preprocess.threads`, in alternating rounds (1, 2, 1, 2 ...) so that the
machine's other work falls on every variant alike. In each: a warm-up, then `concurrency`
requests in flight on one connection for `seconds`: throughput, P50, P99, the requests that
failed, each preprocess replica's CPU (% of one core and ms per image) and its share of the
time spent in its steps (from its step-duration histogram: what it lacks is time the replica
had no work, or waited for its next message, whatever other work took the cores), the
gateway's and the other layers' CPU (and their ms per image), the mean requests a flight
carried (from the gateway's metrics page), the CPU the machine spent outside the system under
test and the load tool (other work sharing the cores), and the 1-minute load average. Then the
median throughput of each variant and its ratio to the first.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import psutil
from prometheus_client.parser import text_string_to_metric_families

from bench import gateway_counts
from bench.deployment import running
from bench.image_chain import CLIENT, WARM_SECONDS, image_config
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed
from strata.tools.launch import Supervisor

Variant = tuple[int, int]  # preprocess replicas, preprocess.threads


@dataclass(frozen=True)
class Sample:
    """One variant's figures in one round."""

    images: float  # answered per second
    p50_ms: float
    p99_ms: float
    failed: int
    error: str  # the commonest failure, if any
    replicas: list[float]  # each preprocess replica's CPU, % of one core
    in_steps: list[float]  # each preprocess replica's time in its steps, % of the sample
    per_image: float  # preprocess CPU ms per image, all replicas
    gateway: float  # % of one core
    layers: float  # inference and postprocess, % of one core
    others: float  # the machine's CPU outside the system under test, % of one core
    load: float  # 1-minute load average at the end
    flight: float  # requests a flight carried, on average


def compare(
    config: Path,
    variants: list[Variant],
    requests: tuple[bytes, ...],
    timing: tuple[int, float, int],
    objective_ms: float | None = None,
) -> str:
    """The table of every round (`timing`: rounds, seconds a sample, requests in flight),
    then each variant's median and ratio to the first."""
    rounds, seconds, concurrency = timing
    lines = [
        f"{concurrency} in flight, {seconds:g} s a sample, variants alternated each round.",
        "",
        "| round | replicas x threads | images/s | P50 ms | P99 ms | failed "
        "| each replica's CPU % | each replica in steps % | preprocess CPU ms/image "
        "| gateway CPU % "
        "| inference+postprocess CPU % | gateway / other layers CPU ms/image "
        "| requests a flight | other work CPU % | load avg |",
        "|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    samples: dict[Variant, list[Sample]] = defaultdict(list)
    with LoadPool(1) as pool:
        for round_ in range(1, rounds + 1):
            for variant in variants:
                with tempfile.TemporaryDirectory(prefix="strata-") as tmp:
                    path = image_config(config, Path(tmp), objective_ms, variant)
                    (Path(tmp) / "run").mkdir()
                    with running(
                        path, Path(tmp) / "run", gateway_metrics=True, preprocess_metrics=True
                    ) as (supervisor, _):
                        plan = _plan(supervisor, requests)
                        sample = _sample(supervisor, pool, plan, concurrency, seconds)
                samples[variant].append(sample)
                lines.append(_row(round_, variant, sample))
                print(lines[-1], flush=True)
    errors = Counter(s.error for v in samples.values() for s in v if s.error)
    if errors:
        lines += ["", f"Commonest failure: {errors.most_common(1)[0][0][:300]}"]
    return "\n".join([*lines, "", *_summary(variants, samples)])


def _plan(supervisor: Supervisor, requests: tuple[bytes, ...]) -> Plan:
    return Plan(
        target=supervisor.address("gateway"),
        method=INFER,
        requests=requests,
        metadata=CLIENT,
        timeout=30,
        connections=1,
    )


def _sample(
    supervisor: Supervisor, pool: LoadPool, plan: Plan, concurrency: int, seconds: float
) -> Sample:
    processes = {n: psutil.Process(p.pid) for n, p in supervisor.processes.items()}
    warm = closed(pool, plan, concurrency, WARM_SECONDS)
    failures = warm.error_counts()
    metrics = supervisor.settings.services.gateway.metrics
    assert metrics is not None, "started with gateway_metrics"
    flown = gateway_counts.read(metrics)
    preprocess = supervisor.settings.services.preprocess
    pages = [preprocess.metrics_for(listen) or "" for listen in preprocess.listens]
    stepped = [_step_seconds(page) for page in pages]
    before, machine, start = _cpu(processes), _machine(), time.monotonic()
    results = closed(pool, plan, concurrency, seconds)
    after, busy, wall = _cpu(processes), _machine() - machine, time.monotonic() - start
    landed = gateway_counts.read(metrics)
    in_steps = [(_step_seconds(p) - s) * 100 / wall for p, s in zip(pages, stepped, strict=True)]
    used = {name: (after[name] - before[name]) * 100 / wall for name in processes}
    replicas = [used[n] for n in sorted(used) if n.startswith("preprocess")]
    gateway = sum(v for n, v in used.items() if n.startswith("gateway"))
    images = results.throughput()
    return Sample(
        images=images,
        p50_ms=results.percentile_ms(50),
        p99_ms=results.percentile_ms(99),
        failed=failures.total() + results.error_counts().total(),
        error=next(iter((failures + results.error_counts()).most_common(1)), ("", 0))[0],
        replicas=replicas,
        in_steps=in_steps,
        per_image=sum(replicas) * 10 / max(images, 1e-9),  # % of a core -> ms a second
        gateway=gateway,
        layers=sum(used.values()) - sum(replicas) - gateway,
        # The load tool's own process is among "other work": one client, the same in each.
        others=busy * 100 / wall - sum(used.values()),
        load=os.getloadavg()[0],
        flight=(landed.flight_requests - flown.flight_requests)
        / max(landed.flights - flown.flights, 1),
    )


def _step_seconds(page: str) -> float:
    """Seconds a preprocess replica has spent in its steps, from its metrics page at `page`."""
    with urllib.request.urlopen(f"http://{page}/metrics", timeout=gateway_counts.TIMEOUT) as got:
        text = got.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "strata_preprocess_step_duration_seconds_sum"
    )


def _cpu(processes: dict[str, psutil.Process]) -> dict[str, float]:
    return {name: sum(p.cpu_times()[:2]) for name, p in processes.items()}


def _machine() -> float:
    """CPU seconds the whole machine has been busy."""
    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def _row(round_: int, variant: Variant, s: Sample) -> str:
    each = " / ".join(f"{c:.0f}" for c in s.replicas)
    stepping = " / ".join(f"{c:.0f}" for c in s.in_steps)
    per_image = 10 / max(s.images, 1e-9)  # % of a core -> ms an image
    return (
        f"| {round_} | {variant[0]} x {variant[1]} | {s.images:.1f} | {s.p50_ms:.0f} "
        f"| {s.p99_ms:.0f} | {s.failed} | {each} | {stepping} | {s.per_image:.1f} "
        f"| {s.gateway:.0f} "
        f"| {s.layers:.0f} | {s.gateway * per_image:.2f} / {s.layers * per_image:.2f} "
        f"| {s.flight:.1f} | {s.others:.0f} | {s.load:.1f} |"
    )


def _summary(variants: list[Variant], samples: dict[Variant, list[Sample]]) -> list[str]:
    base = statistics.median(s.images for s in samples[variants[0]])
    lines = [
        "| replicas x threads | median images/s | x the first | median load avg |",
        "|---|---:|---:|---:|",
    ]
    for variant in variants:
        images = statistics.median(s.images for s in samples[variant])
        load = statistics.median(s.load for s in samples[variant])
        lines.append(
            f"| {variant[0]} x {variant[1]} | {images:.1f} | {images / base:.2f} | {load:.1f} |"
        )
    return lines
