"""Soak: `python -m bench.soak --config configs/default.yaml [--minutes 10]` (`make soak`).

A steady open-loop load on every pipeline that has a demo data set, for `--minutes`, while
each service's resident memory (RSS) and open file descriptors are sampled every
`--interval` seconds. Growth per hour is the least-squares slope of the samples taken after
the warm-up (caches fill, arenas grow, then memory should stay flat). The soak fails (exit
status 1) if any service grows faster than `--max-growth-mb-per-hour` or
`--max-fd-growth-per-hour`, if a service exits, or if more than `--max-error-rate` of the
requests fail. Results go to `--out`: soak.md, soak.json and soak.png.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: files only
import matplotlib.pyplot as plt
import numpy as np
import psutil

from bench.deployment import running, service_pids
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import point
from bench.report import machine
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
MB = 1024 * 1024
SHORT_SECONDS = 300  # less measured time than this, and a slope says little


@dataclass
class Series:
    """One service's samples: seconds since the start, RSS in MB, open descriptors."""

    name: str
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)

    def growth(self, values: list[float], warmup: float) -> float:
        """Per hour: the slope of the samples after `warmup` seconds (0 if too few)."""
        kept = [(t, v) for t, v in zip(self.seconds, values, strict=True) if t >= warmup]
        if len(kept) < 3 or kept[-1][0] - kept[0][0] <= 0:
            return 0.0
        t, v = np.array(kept).T
        return float(np.polyfit(t / 3600.0, v, 1)[0])


class Sampler:
    """Reads every service's RSS and descriptor count, at most once per `interval`."""

    def __init__(self, pids: dict[str, int], interval: float) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.series = {name: Series(name) for name in pids}
        self.interval = interval
        self.start = time.monotonic()
        self._next = 0.0
        self.gone: set[str] = set()

    def maybe(self, *_: object, force: bool = False) -> None:
        """Sample if `interval` has passed (the load pool calls this as it waits)."""
        now = time.monotonic() - self.start
        if now < self._next and not force:
            return
        self._next = now + self.interval
        for name, process in self.processes.items():
            try:
                with process.oneshot():
                    rss, fds = process.memory_info().rss / MB, process.num_fds()
            except psutil.NoSuchProcess:
                self.gone.add(name)
                continue
            series = self.series[name]
            series.seconds.append(now)
            series.rss_mb.append(rss)
            series.fds.append(fds)


@dataclass
class Verdict:
    service: str
    rss_start_mb: float
    rss_end_mb: float
    rss_growth_mb_per_hour: float
    fds_start: int
    fds_end: int
    fd_growth_per_hour: float
    ok: bool


def verdicts(sampler: Sampler, warmup: float, args: argparse.Namespace) -> list[Verdict]:
    out = []
    for name, s in sampler.series.items():
        if not s.seconds:
            continue
        rss = s.growth(s.rss_mb, warmup)
        fds = s.growth([float(f) for f in s.fds], warmup)
        ok = rss <= args.max_growth_mb_per_hour and fds <= args.max_fd_growth_per_hour
        ok = ok and name not in sampler.gone
        out.append(Verdict(name, s.rss_mb[0], s.rss_mb[-1], rss, s.fds[0], s.fds[-1], fds, ok))
    return out


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on the way out
    settings = load_settings(args.config)
    loads = [workload(settings, p) for p in settings.pipelines if has_dataset(p)]
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(60.0, 0.2 * seconds)
    with (
        tempfile.TemporaryDirectory(prefix="strata-soak-") as tmp,
        LoadPool(1) as pool,
        running(args.config, Path(tmp)) as (supervisor, _),
    ):
        plan = Plan(
            target=supervisor.address("gateway"),
            method=INFER,
            requests=_interleave([w.pipeline_requests for w in loads]),
            metadata=(("x-client-id", "strata-soak"),),
            timeout=10.0,
            rps=args.rps,
            duration=seconds,
        )
        sampler = Sampler(service_pids(supervisor), args.interval)
        print(f"soak: {args.rps:g} requests/s for {args.minutes:g} min", flush=True)
        results = pool.run(plan, sampler.maybe)
        sampler.maybe(force=True)
        exited = supervisor.failed()
    load = point("soak", results, min(w.objective_seconds for w in loads))
    found = verdicts(sampler, warmup, args)
    failures = [f"{v.service} grew too fast" for v in found if not v.ok]
    failures += [f"{name} exited during the soak" for name in sorted(sampler.gone)]
    if exited:
        failures.append(f"{exited} exited during the soak")
    if load.error_rate > args.max_error_rate:
        failures.append(f"{load.error_rate:.1%} of requests failed: {load.errors}")
    text = markdown(args, warmup, load, found, failures)
    print(text)
    for path in write(args.out, text, args, sampler, load, found, failures):
        print(f"wrote {path}")
    return 1 if failures else 0


def markdown(args, warmup: float, load, found: list[Verdict], failures: list[str]) -> str:
    lines = [
        "# Soak",
        "",
        f"Machine: {machine()}. {args.rps:g} requests/s for {args.minutes:g} min; growth is "
        f"the slope after a {warmup:.0f} s warm-up. Bounds: "
        f"{args.max_growth_mb_per_hour:g} MB/h RSS, {args.max_fd_growth_per_hour:g} fds/h.",
        "",
        f"Load: {load.count} requests, {load.throughput:.1f} answered/s, P50 "
        f"{load.p50_ms:.1f} ms, P99 {load.p99_ms:.1f} ms, errors {load.errors or 'none'}.",
        "",
        "| service | RSS MB start → end | RSS growth MB/h | fds start → end | fd growth /h | ok |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for v in found:
        lines.append(
            f"| {v.service} | {v.rss_start_mb:.1f} → {v.rss_end_mb:.1f} "
            f"| {v.rss_growth_mb_per_hour:+.1f} | {v.fds_start} → {v.fds_end} "
            f"| {v.fd_growth_per_hour:+.1f} | {'yes' if v.ok else 'NO'} |"
        )
    if args.minutes * 60 - warmup < SHORT_SECONDS:
        lines += [
            "",
            f"Under {SHORT_SECONDS // 60} minutes of samples: growth per hour "
            "extrapolates warm-up and noise; trust a longer run.",
        ]
    verdict = "FAILED: " + "; ".join(failures) if failures else "passed"
    return "\n".join([*lines, "", f"Soak {verdict}.", ""])


def write(out: Path, text: str, args, sampler: Sampler, load, found, failures) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "soak.md", out / "soak.json", out / "soak.png"]
    paths[0].write_text(text)
    data = {
        "machine": machine(),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "load": {
            k: None if isinstance(v, float) and math.isnan(v) else v
            for k, v in load.as_dict().items()
        },
        "services": [asdict(v) for v in found],
        "samples": [asdict(s) for s in sampler.series.values()],
        "failures": failures,
    }
    paths[1].write_text(json.dumps(data, indent=2) + "\n")
    plot(sampler, paths[2])
    return paths


def plot(sampler: Sampler, path: Path) -> None:
    figure, (rss, fds) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for s in sampler.series.values():
        minutes = [t / 60 for t in s.seconds]
        rss.plot(minutes, s.rss_mb, label=s.name)
        fds.plot(minutes, s.fds, label=s.name)
    rss.set_ylabel("RSS, MB")
    fds.set_ylabel("open file descriptors")
    fds.set_xlabel("minutes")
    rss.set_title("Services during the soak")
    rss.legend(fontsize="small", ncol=3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def _interleave(groups: list[tuple[bytes, ...]]) -> tuple[bytes, ...]:
    """Requests of every pipeline in turn, so each sees the load all the time."""
    longest = max(len(g) for g in groups)
    return tuple(g[i % len(g)] for i in range(longest) for g in groups)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--minutes", type=float, default=10.0, help="how long (default 10)")
    parser.add_argument("--rps", type=float, default=30.0, help="requests per second (30)")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    parser.add_argument(
        "--warmup",
        type=float,
        help="seconds not counted in the growth (default: 20%% of the run, at most 60)",
    )
    parser.add_argument(
        "--max-growth-mb-per-hour",
        type=float,
        default=50.0,
        help="RSS growth that fails the soak (default 50)",
    )
    parser.add_argument(
        "--max-fd-growth-per-hour",
        type=float,
        default=100.0,
        help="descriptor growth that fails the soak (default 100)",
    )
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="share of failed requests that fails the soak (default 0.01)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    return parser


if __name__ == "__main__":
    sys.exit(main())
