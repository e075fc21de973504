"""What a soak measures, for the run (bench/soak.py) and its report (bench/soak_report.py):
each process's resources over time, the verdict on each, and everything the soak found."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass, field

import numpy as np
import psutil

from bench import gateway_counts
from bench.gateway_counts import GatewayCounts
from bench.mixed_load import Mix, Tally

MB = 1024 * 1024
SHORT_SECONDS = 300  # less measured time than this, and a slope says little: not judged


@dataclass
class Series:
    """One process's samples: seconds since the start, RSS in MB, descriptors, threads."""

    name: str
    seconds: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    threads: list[int] = field(default_factory=list)

    def growth(self, values: list[float] | list[int], since: float) -> float:
        """Per hour: the slope of the samples from `since` seconds on (0 if too few)."""
        kept = [(t, v) for t, v in zip(self.seconds, values, strict=True) if t >= since]
        if len(kept) < 3 or kept[-1][0] - kept[0][0] <= 0:
            return 0.0
        t, v = np.array(kept, dtype=float).T
        return float(np.polyfit(t / 3600.0, v, 1)[0])


class Sampler:
    """Reads every process's RSS, descriptors and threads, and the gateway's refusals, at
    most once per `interval`."""

    def __init__(self, pids: dict[str, int], interval: float, metrics: str | None) -> None:
        self.processes = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.series = {name: Series(name) for name in pids}
        self.interval = interval
        self.metrics = metrics
        self.counts = GatewayCounts()  # the latest read
        self.refused: list[tuple[float, int]] = []  # (seconds, refusals so far)
        self.load: list[float] = []  # the machine's 1-minute load average, each sample
        self.unread: str | None = None  # why the metrics page could not be read, if it could not
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
                    threads = process.num_threads()
            except psutil.NoSuchProcess:
                self.gone.add(name)
                continue
            series = self.series[name]
            series.seconds.append(now)
            series.rss_mb.append(rss)
            series.fds.append(fds)
            series.threads.append(threads)
        self.load.append(os.getloadavg()[0])
        self._read_gateway(now)

    def _read_gateway(self, now: float) -> None:
        if self.metrics is None:
            return
        try:
            self.counts = gateway_counts.read(self.metrics)
        except OSError as exc:
            self.unread = f"{self.metrics}: {exc}"
            return
        self.refused.append((now, self.counts.refused))


@dataclass
class Verdict:
    """One process over the soak: start, end and most of each resource, growth per hour."""

    process: str
    rss_mb: tuple[float, float, float]  # start, end, max
    rss_growth_mb_per_hour: float  # after the warm-up
    rss_growth_second_half: float  # the second half of that: warm-up left over fades here
    fds: tuple[int, int, int]
    fd_growth_per_hour: float
    threads: tuple[int, int, int]
    thread_growth_per_hour: float
    judged: bool  # long enough after the warm-up for the slopes to mean something
    ok: bool


def verdicts(sampler: Sampler, warmup: float, args: argparse.Namespace) -> list[Verdict]:
    out = []
    for name, s in sampler.series.items():
        if not s.seconds:
            continue
        judged = s.seconds[-1] - warmup >= SHORT_SECONDS
        half = warmup + (s.seconds[-1] - warmup) / 2
        rss, fds, threads = (s.growth(v, warmup) for v in (s.rss_mb, s.fds, s.threads))
        within = (
            rss <= args.max_growth_mb_per_hour
            and fds <= args.max_fd_growth_per_hour
            and threads <= args.max_thread_growth_per_hour
        )
        out.append(
            Verdict(
                process=name,
                rss_mb=_span(s.rss_mb),
                rss_growth_mb_per_hour=rss,
                rss_growth_second_half=s.growth(s.rss_mb, half),
                fds=_span(s.fds),
                fd_growth_per_hour=fds,
                threads=_span(s.threads),
                thread_growth_per_hour=threads,
                judged=judged,
                ok=(within or not judged) and name not in sampler.gone,
            )
        )
    return out


def _span(values: list) -> tuple:
    return values[0], values[-1], max(values)


@dataclass
class Soak:
    """Everything a soak found, for the report."""

    args: argparse.Namespace
    mix: Mix
    started: str  # when the load began, UTC
    warmup: float
    kinds: dict[str, Tally]
    cases: dict[str, Tally]  # each bad input case
    sampler: Sampler
    found: list[Verdict]
    failures: list[str]
    warnings: list[str]  # why the steady load's figures may describe the load tool
