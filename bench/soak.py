"""Soak: `python -m bench.soak --config configs/default.yaml [--minutes 60]` (`make soak`).

The mixed load a fleet sends (bench/mixed_load.py: steady gRPC on several connections, REST
keep-alive, a new connection every second, a trickle of bad inputs) for `--minutes`, while
each service's resident memory (RSS), open file descriptors and threads are sampled every
`--interval` seconds, with the gateway's refusals by reason from its metrics page. Growth per
hour is the least-squares slope of the samples taken after the warm-up (caches fill, arenas
grow, then memory should stay flat). The soak fails (exit status 1) if any service grows
faster than the `--max-*-growth-per-hour` bounds (judged only on runs with at least five
minutes after the warm-up), if a service exits, if more than `--max-error-rate` of any kind's
requests fail (a bad input refused as its case expects is right, not failed), or if the load
itself breaks. Results go to `--out`: soak.md, soak.json and soak.png.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench.deployment import running, service_pids
from bench.load import LoadPool
from bench.mixed_load import Mix, SideTraffic, Tally, interleave, steady_plan
from bench.soak_data import Sampler, Soak, Verdict, verdicts
from bench.soak_report import write
from bench.workloads import has_dataset, workload
from strata.config import load_settings

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_MINUTES = 0.4


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.quick:
        args.minutes, args.interval, args.warmup = QUICK_MINUTES, 1.0, 5.0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the services on the way out
    soak = run(args)
    text, paths = write(soak)
    print(text)
    for path in paths:
        print(f"wrote {path}")
    return 1 if soak.failures else 0


def run(args: argparse.Namespace) -> Soak:
    """Start the system, send the mixed load for the soak's length while sampling, judge."""
    settings = load_settings(args.config)
    loads = [workload(settings, p) for p in settings.pipelines if has_dataset(p)]
    mix = _mix(args)
    seconds = args.minutes * 60
    warmup = args.warmup if args.warmup is not None else min(300.0, 0.1 * seconds)
    with (
        tempfile.TemporaryDirectory(prefix="strata-soak-") as tmp,
        LoadPool(1) as pool,
        running(args.config, Path(tmp), gateway_metrics=True) as (supervisor, _),
    ):
        gateway = supervisor.settings.services.gateway
        side = SideTraffic(
            supervisor.address("gateway"), f"http://{gateway.rest}", loads, mix, seconds
        )
        requests = interleave([w.pipeline_requests for w in loads])
        plan = steady_plan(supervisor.address("gateway"), requests, mix, seconds)
        sampler = Sampler(service_pids(supervisor), args.interval, gateway.metrics)
        started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
        print(f"soak: {args.minutes:g} min of mixed load from {started} UTC", flush=True)
        side.start()
        results = pool.run(plan, sampler.maybe)
        side.stop()
        sampler.maybe(force=True)
        exited = supervisor.failed()
    kinds = {"grpc": Tally.of(results), **side.tallies, "bad": side.bad_tally()}
    found = verdicts(sampler, warmup, args)
    failures = _failures(args, found, sampler, kinds, exited, side.error)
    warnings = results.warnings()
    return Soak(args, mix, started, warmup, kinds, side.cases, sampler, found, failures, warnings)


def _failures(
    args: argparse.Namespace,
    found: list[Verdict],
    sampler: Sampler,
    kinds: dict[str, Tally],
    exited: str | None,
    broke: str | None,
) -> list[str]:
    """Why the soak failed (none: it passed)."""
    out = [_too_fast(v) for v in found if not v.ok and v.process not in sampler.gone]
    out += [f"{name} exited during the soak" for name in sorted(sampler.gone)]
    if exited and exited not in sampler.gone:
        out.append(f"{exited} exited during the soak")
    for kind, tally in kinds.items():
        if not tally.sent:
            out.append(f"the {kind} load sent nothing")
        elif sum(tally.failed.values()) / tally.sent > args.max_error_rate:
            out.append(f"{kind}: {sum(tally.failed.values())} of {tally.sent} failed")
    if broke:
        out.append(f"the side traffic stopped early: {broke}")
    if sampler.metrics and not sampler.refused:
        out.append(f"the gateway's metrics could not be read ({sampler.unread})")
    return out


def _too_fast(v: Verdict) -> str:
    return (
        f"{v.process} grew too fast: RSS {v.rss_growth_mb_per_hour:+.1f} MB/h, fds "
        f"{v.fd_growth_per_hour:+.1f}/h, threads {v.thread_growth_per_hour:+.1f}/h"
    )


def _mix(args: argparse.Namespace) -> Mix:
    return Mix(
        grpc_rps=args.grpc_rps,
        grpc_connections=args.grpc_connections,
        grpc_in_flight=args.grpc_in_flight,
        rest_rps=args.rest_rps,
        rest_connections=args.rest_connections,
        churn_seconds=args.churn_seconds,
        bad_rps=args.bad_rps,
    )


def _parser() -> argparse.ArgumentParser:
    mix = Mix()
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    add = parser.add_argument
    add("--config", type=Path, default=Path("configs/default.yaml"))
    add("--minutes", type=float, default=60.0, help="how long (default 60)")
    add("--quick", action="store_true", help=f"a smoke run of {QUICK_MINUTES * 60:.0f} s")
    add(
        "--grpc-rps",
        type=float,
        default=mix.grpc_rps,
        help="steady gRPC requests/s, in all; 0: closed loop",
    )
    add("--grpc-connections", type=int, default=mix.grpc_connections)
    add("--grpc-in-flight", type=int, default=mix.grpc_in_flight, help="most per connection")
    add("--rest-rps", type=float, default=mix.rest_rps, help="REST keep-alive requests/s, in all")
    add("--rest-connections", type=int, default=mix.rest_connections)
    add(
        "--churn-seconds", type=float, default=mix.churn_seconds, help="a new connection this often"
    )
    add("--bad-rps", type=float, default=mix.bad_rps, help="bad inputs/s")
    add("--interval", type=float, default=5.0, help="seconds between samples")
    add(
        "--warmup",
        type=float,
        help="seconds not counted in the growth (default: 10%% of the run, at most 300)",
    )
    add(
        "--max-growth-mb-per-hour",
        type=float,
        default=1.0,
        help="RSS growth of any process that fails the soak (default 1, issue 50's target)",
    )
    add(
        "--max-fd-growth-per-hour",
        type=float,
        default=100.0,
        help="descriptor growth that fails it",
    )
    add(
        "--max-thread-growth-per-hour", type=float, default=20.0, help="thread growth that fails it"
    )
    add(
        "--max-error-rate",
        type=float,
        default=0.01,
        help="share of a kind's requests failed that fails it",
    )
    add("--out", type=Path, default=RESULTS, help="where results go")
    return parser


if __name__ == "__main__":
    sys.exit(main())
