"""Overload: `python -m bench.overload --config configs/default.yaml [--quick] [--against K=V]`.

What a user past capacity sees. The system from the config on free ports, the ladder free; the
first pipeline with a demo data set. Every call carries the same deadline (`--deadline`, 1 s),
in the capacity search and the open loop alike, so that the sweep measures the server and no
change of deadline between its phases. Capacity is the best rate of full
answers (within the objective or not) over closed loops of 16, 64 and 256 in flight from the
most connections asked for; then an open loop (no coordinated omission) at 0.8, 1, 1.5, 2 and
4x that rate from each number of connections in `--connections` (by default 2 and 8, the
issue's figure; one load worker for one connection, else two sharing them), each step once
the ladder is calm again. Per step: goodput (full answers within the pipeline's objective) and its
share of the best step's, the P99 of admitted requests (answered, full or degraded), the share
refused (RESOURCE_EXHAUSTED or UNAVAILABLE) and the P99 of the time a refusal took, the
degraded share, other errors, the highest level the ladder reached, the slowest health answer
(a gRPC health check on the public port, behind every call gRPC has queued there; the same on
the admin port; GET /readyz on the metrics port) and how late the load tool's sends were (P99;
it shares the machine's cores).

`--front` (haproxy on PATH) also sends every step through HAProxy before the same gateway
(deploy/front/haproxy.cfg), in turn with the direct runs, so that the two are compared under
the same machine load. The front is fitted to the capacity found and the pipeline's objective
(bench/front.py `FrontSettings.sized`: places for a fifth of the objective in the gateway, a
queue of a fifth of it, refused on arrival past what the rate clears in that wait), the rate
being what a closed loop of its places reaches, resized until the places settle;
`--front-places`, `--front-queue-ms` and `--front-rate` override each, and the variables a
deployment sets are printed and reported. `--front-against places=64,queue_ms=100` runs
another front beside it before the same gateway, with those values changed, so that two
sizings meet the same machine load. Each front step also reports
HAProxy's own average time in its queue and in the gateway over its last 1,024 calls, so that
an admitted call's latency reads as the two. The capacity search is run through the front as
well and reported beside the direct one (the front's own CPU shares the machine), but the
steps' rates stay the direct gateway's.

`--against gateway.KEY=VALUE` (repeatable, e.g. `ladder.door_wait_share=0`) runs a second
system with those gateway settings changed beside the configured one, both up at once: the same
rates (from the first system's capacity), the systems in turn at each step, so that a change in
the machine's load falls on both alike, and the table has them side by side. Results go to
`--out` (bench/results/overload.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from bench.admin import Admin, LevelWatch
from bench.deployment import free_port, running
from bench.front import FrontSettings, counters, front, haproxy
from bench.load import LoadPool, Plan, Results
from bench.load.worker import INFER
from bench.measure import closed, opened
from bench.workloads import has_dataset, workload
from strata.config import load_settings
from strata.tools.launch import Supervisor

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
FRACTIONS = (0.8, 1.0, 1.5, 2.0, 4.0)
IN_FLIGHT = (16, 64, 256)
CONNECTIONS = "2,8"  # the figure; 1 costs a sweep more
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], grpc.StatusCode.UNAVAILABLE.value[0])
CALM_SECONDS = 30.0  # the most a step waits for the ladder to come back to level 0
FIT_ROUNDS = 3  # closed loops at most to fit the front's places to the rate they reach
SETTLED = 0.9  # places that shrink less than this between rounds have settled


class HealthProbe:
    """Every 50 ms, from its own thread, the gateway's health asked three ways: a
    grpc.health.v1 Check on its public port (a client's view, served among the requests,
    behind every call gRPC has queued on that port), the same Check on its admin port (a
    server of its own in the same process: what a gRPC probe should ask), and GET /readyz on
    its metrics port (what the shipped container and Kubernetes probes ask, answered from the
    metrics server's thread)."""

    def __init__(self, address: str, admin: str, metrics: str) -> None:
        self._stubs = [
            health_pb2_grpc.HealthStub(grpc.insecure_channel(target)) for target in (address, admin)
        ]
        self._readyz = f"http://{metrics}/readyz"
        self._stop = threading.Event()
        self.grpc_seconds: list[float] = []
        self.admin_seconds: list[float] = []
        self.readyz_seconds: list[float] = []
        self._thread = threading.Thread(target=self._probe)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def slowest(self) -> tuple[float, float, float]:
        """The slowest answer of each way, seconds (infinity: one failed)."""
        kept = (self.grpc_seconds, self.admin_seconds, self.readyz_seconds)
        return tuple(max(seconds, default=float("nan")) for seconds in kept)

    def _probe(self) -> None:
        public, admin = self._stubs
        while not self._stop.is_set():
            self.grpc_seconds.append(_timed(lambda: _check(public)))
            self.admin_seconds.append(_timed(lambda: _check(admin)))
            self.readyz_seconds.append(_timed(self._get_readyz))
            time.sleep(0.05)

    def _get_readyz(self) -> None:
        with urllib.request.urlopen(self._readyz, timeout=2) as reply:
            reply.read()


def _check(stub: health_pb2_grpc.HealthStub) -> None:
    stub.Check(health_pb2.HealthCheckRequest(), timeout=2)


def _timed(probe: Callable[[], None]) -> float:
    """Seconds `probe` took; infinity if it failed."""
    started = time.perf_counter()
    try:
        probe()
    except (grpc.RpcError, OSError):
        return float("inf")
    return time.perf_counter() - started


@dataclass
class Step:
    """One open-loop step's figures, as its client saw them."""

    system: str
    connections: int
    label: str
    offered: float  # requests per second sent
    goodput: float  # full answers within the objective, per second
    admitted_p99_ms: float  # answered requests, full or degraded
    refused: float  # share of requests
    refusal_p99_ms: float
    degraded: float  # share of requests
    other_errors: dict[str, int]
    level: int | None  # the highest the ladder reached
    health_ms: tuple[float, float, float]  # slowest: public port, admin port, /readyz
    late_p99_ms: float  # how late the load tool sent
    busiest: float  # the busiest load worker's share of a core
    front_ms: tuple[float, float] | None = None  # HAProxy's average: in its queue, in the gateway


def measured(system: str, label: str, results: Results, objective: float) -> Step:
    """A step's figures from every request it sent (latencies from when each was due)."""
    count = max(results.count, 1)
    answered = results.ok
    refused = np.isin(results.code, REFUSED)
    refusals = results.latency[refused] / 1e6
    client = results.client()
    codes = results.codes()
    other = {code: n for code, n in codes.items() if code not in _REFUSED_NAMES | {"OK"}}
    return Step(
        system=system,
        connections=results.plan.connections,
        label=label,
        offered=results.plan.rps or 0.0,
        goodput=results.goodput(objective),
        admitted_p99_ms=_p99(results.latency[answered] / 1e6),
        refused=float(refused.sum()) / count,
        refusal_p99_ms=_p99(refusals),
        degraded=results.degraded() / count,
        other_errors=other,
        level=None,
        health_ms=(float("nan"),) * 3,
        late_p99_ms=client["sendLagP99"] * 1e3,
        busiest=client["busiestWorkerCpu"],
    )


_REFUSED_NAMES = {"ResourceExhausted", "Unavailable"}


def _p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else float("nan")


def full_rate(results: Results) -> float:
    """Full answers (not degraded), however late, per second."""
    seconds = results.total_seconds
    full = results.ok & (results.flags & 1 == 0)
    return float(full.sum()) / seconds if seconds else 0.0


def capacity(
    pool: LoadPool, plan: Plan, seconds: float, in_flight: tuple[int, ...]
) -> dict[int, float]:
    """The rate of full answers of a closed loop of each of `in_flight` requests."""
    rates = {}
    for count in in_flight:
        rates[count] = full_rate(closed(pool, plan, count, seconds))
        print(f"closed loop, {count} in flight: {rates[count]:.0f} full answers/s", flush=True)
    return rates


def searched(
    what: str,
    system: System,
    pool: LoadPool,
    connections: int,
    seconds: float,
    in_flight: tuple[int, ...],
) -> tuple[dict[int, float], str]:
    """`system`'s rates from `connections` by calls in flight (its capacity: the best), and a
    line that says its capacity as `what`."""
    rates = capacity(pool, replace(system.plan, connections=connections), seconds, in_flight)
    line = f"{what} (the best of {in_flight} in flight): {max(rates.values()):.0f}/s"
    print(line, flush=True)
    return rates, line


@dataclass
class System:
    """One running system under test, with its admin client and level watch."""

    name: str
    supervisor: Supervisor
    plan: Plan  # the load, aimed at its gateway
    admin: Admin
    levels: LevelWatch
    probes: tuple[str, str]  # its admin port and metrics page
    front_metrics: str | None = None  # the Prometheus page of the front it is reached through

    def step(
        self,
        pool: LoadPool,
        connections: int,
        label: str,
        rate: float,
        seconds: float,
        objective: float,
    ) -> Step:
        """One open-loop step at `rate` from `connections`, once the ladder is calm."""
        time.sleep(1.0)
        if not self.admin.wait_calm(CALM_SECONDS):
            print(f"{self.name}: the ladder was not calm within {CALM_SECONDS:.0f} s")
        since = time.time()
        with HealthProbe(self.plan.target, *self.probes) as probe:
            results = opened(pool, replace(self.plan, connections=connections), rate, seconds)
        step = measured(self.name, label, results, objective)
        step.level = self.levels.highest(since, time.time())
        step.health_ms = tuple(seconds * 1e3 for seconds in probe.slowest())
        if self.front_metrics is not None:
            step.front_ms = front_times(self.front_metrics)
        return step


def front_times(metrics: str) -> tuple[float, float]:
    """HAProxy's average time in its queue and in the gateway, ms, over its last 1,024
    calls (the end of a step)."""
    found = counters(metrics)
    return tuple(
        found[f"haproxy_backend_{what}_time_average_seconds"] * 1e3
        for what in ("queue", "response")
    )


@contextmanager
def fronted(system: System, settings: FrontSettings) -> Iterator[System]:
    """The same running system reached through HAProxy (deploy/front) instead of directly."""
    _, readyz = system.probes
    metrics = f"127.0.0.1:{free_port()}"
    with front(system.plan.target, readyz, settings, metrics) as address:
        name = (
            f"{system.name}, behind the front ({settings.places} places, "
            f"{settings.queue_ms} ms, {settings.rate}/s)"
        )
        plan = replace(system.plan, target=address)
        yield replace(system, name=name, plan=plan, front_metrics=metrics)


@contextmanager
def started(name: str, config: Path, gateway: dict | None, plan: Plan) -> Iterator[System]:
    """`config` running on free ports, `gateway` settings changed, watched from its admin port."""
    with (
        tempfile.TemporaryDirectory(prefix="strata-") as tmp,
        running(config, Path(tmp), gateway=gateway, gateway_metrics=True, gateway_admin=True) as (
            supervisor,
            token,
        ),
    ):
        front = supervisor.settings.services.gateway
        admin = Admin(front.admin_listen, token)
        try:
            with LevelWatch(admin) as levels:
                aimed = replace(plan, target=supervisor.address("gateway"))
                yield System(
                    name, supervisor, aimed, admin, levels, (front.admin_listen, front.metrics)
                )
        finally:
            admin.close()


def sweep(
    systems: list[System], pools: dict[int, LoadPool], rates, seconds: float, objective: float
) -> list[Step]:
    """Every step on every system, the systems in turn at each step, so that a change in the
    machine's load falls on all of them alike."""
    steps = []
    for connections, pool in pools.items():
        for label, rate in rates:
            for system in systems:
                steps.append(system.step(pool, connections, label, rate, seconds, objective))
                print(row_text(steps[-1]), flush=True)
    return steps


def row_text(step: Step) -> str:
    public, admin, readyz = step.health_ms
    return (
        f"{step.system}, {step.connections} connection(s), {step.label}: offered "
        f"{step.offered:.0f}/s, goodput {step.goodput:.0f}/s, admitted P99 "
        f"{step.admitted_p99_ms:.0f} ms, refused {step.refused:.0%} (P99 "
        f"{step.refusal_p99_ms:.1f} ms), degraded {step.degraded:.0%}, other errors "
        f"{step.other_errors or 'none'}, level {step.level}, slowest gRPC health check "
        f"{public:.0f} ms (admin port {admin:.0f} ms), slowest /readyz {readyz:.0f} ms, "
        f"sends late P99 {step.late_p99_ms:.1f} ms{_front_text(step)}"
    )


def _front_text(step: Step) -> str:
    if step.front_ms is None:
        return ""
    queued, served = step.front_ms
    return f", the front's averages: {queued:.0f} ms queued, {served:.0f} ms in the gateway"


HEADER = (
    "| connections | load | system | offered/s | goodput/s | % of peak | admitted P99 ms "
    "| refused | refusal P99 ms | degraded | other errors | top level "
    "| slowest health ms: public port | admin port | /readyz | sends late P99 ms "
    "| busiest client worker | front's average ms: queued | in the gateway |\n"
    "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def report(steps: list[Step]) -> str:
    """One table, each step's systems side by side; a goodput share only where the system
    answered something within the objective from that many connections (no peak: said so)."""
    peaks: dict[tuple[str, int], float] = {}
    for step in steps:
        key = (step.system, step.connections)
        peaks[key] = max(peaks.get(key, 0.0), step.goodput)
    order = {label: n for n, label in enumerate(dict.fromkeys(s.label for s in steps))}
    ordered = sorted(steps, key=lambda s: (s.connections, order[s.label]))
    lines = [HEADER, *(_row(step, peaks[(step.system, step.connections)]) for step in ordered)]
    lines += [
        f"\nNo step of {system} from {connections} connection(s) had a full answer within "
        "the objective: there is no peak goodput to compare with."
        for (system, connections), peak in peaks.items()
        if peak <= 0
    ]
    return "\n".join(lines)


def _row(step: Step, peak: float) -> str:
    share = f"{step.goodput / peak:.0%}" if peak > 0 else "-"
    refusal = "-" if np.isnan(step.refusal_p99_ms) else f"{step.refusal_p99_ms:.1f}"
    public, admin, readyz = step.health_ms
    other = ", ".join(f"{code} {n}" for code, n in step.other_errors.items()) or "-"
    level = "-" if step.level is None else step.level
    queued, served = ("-", "-") if step.front_ms is None else (f"{t:.0f}" for t in step.front_ms)
    return (
        f"| {step.connections} | {step.label} | {step.system} | {step.offered:.0f} | "
        f"{step.goodput:.0f} | {share} | {step.admitted_p99_ms:.0f} | {step.refused:.0%} | "
        f"{refusal} | {step.degraded:.0%} | {other} | {level} | "
        f"{public:.0f} | {admin:.0f} | {readyz:.0f} | {step.late_p99_ms:.1f} | "
        f"{step.busiest:.0%} | {queued} | {served} |"
    )


def overrides(pairs: list[str], settings: Any) -> dict[str, Any]:
    """`--against` pairs (KEY=VALUE under `gateway`, dotted into its sections, VALUE as
    YAML) as the gateway settings they change, each section whole."""
    gateway = settings.gateway.model_dump(mode="json")
    changed: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"--against {pair!r}: expected KEY=VALUE, e.g. ladder.max_level=2")
        *sections, name = key.split(".")
        where = changed
        source = gateway
        for section in sections:
            source = source.get(section, {}) if isinstance(source, dict) else {}
            where = where.setdefault(section, dict(source))
        where[name] = yaml.safe_load(value)
    return changed


def fitted_front(
    system: System,
    pool: LoadPool,
    connections: int,
    seconds: float,
    rates: dict[int, float],
    objective: float,
) -> FrontSettings:
    """The front for `system`: places for its share of `objective` at the rate the gateway
    reaches with that many calls in flight, and that rate. Sized from its capacity (the best
    of `rates`, full answers a second by calls in flight) first, then from the rate a closed
    loop of its places finds (a gateway that needs more calls in flight than that to reach
    its capacity answers them later than the objective allows), until the places settle or
    the rate calls for more places than were measured."""
    plan = replace(system.plan, connections=connections)
    capacity = max(rates.values())
    seen = dict(rates)
    sizing = FrontSettings.sized(capacity, objective)
    for attempt in range(FIT_ROUNDS):
        # After the capacity search's widest loop the ladder may still degrade every answer,
        # and a loop of degraded answers has no full rate to size from.
        if not system.admin.wait_calm(CALM_SECONDS):
            print(f"{system.name}: the ladder was not calm within {CALM_SECONDS:.0f} s")
        places = sizing.places
        seen[places] = full_rate(closed(pool, plan, places, seconds))
        print(f"closed loop, {places} in flight (the front's places): {seen[places]:.0f}/s")
        kept, refit = refitted(sizing, seen, capacity, objective)
        if refit.places > places:
            return refit  # more places than measured reach at least the rate measured
        if refit.places >= places * SETTLED or attempt == FIT_ROUNDS - 1:
            return kept
        sizing = refit
    raise AssertionError("unreachable: the last round returns")


def refitted(
    sizing: FrontSettings, seen: dict[int, float], capacity: float, objective: float
) -> tuple[FrontSettings, FrontSettings]:
    """`sizing` with the rate its places reach, and the sizing that rate calls for, from the
    rates `seen` by calls in flight (no full answer: `sizing` both times)."""
    # Below its capacity a gateway answers at least as fast with more calls in flight as with
    # fewer: the best rate seen at no more than these places bounds a loop that a busy
    # machine slowed, so that one slow loop does not shrink the places for good.
    rate = min(capacity, max(r for count, r in seen.items() if count <= sizing.places))
    if rate <= 0:
        print("no full answer at the front's places: it keeps the sizing it had")
        return sizing, sizing
    return replace(sizing, rate=max(1, round(rate))), FrontSettings.sized(rate, objective)


def front_for(
    args: argparse.Namespace,
    system: System,
    widest: tuple,
    rates: dict[int, float],
    objective: float,
) -> tuple[FrontSettings, str]:
    """The front to run before `system`: fitted to its capacity and the objective, with any
    value the command line gave in its place; and a line that says what a deployment sets."""
    pool, connections, seconds, _ = widest
    fitted = fitted_front(system, pool, connections, seconds, rates, objective)
    given = {"places": args.front_places, "queue_ms": args.front_queue_ms, "rate": args.front_rate}
    sizing = replace(fitted, **{key: value for key, value in given.items() if value is not None})
    variables = " ".join(f"{key}={value}" for key, value in sizing.variables().items())
    line = f"the front, fitted to it and the {objective * 1e3:g} ms objective: {variables}"
    print(line, flush=True)
    return sizing, line


@contextmanager
def pools(connections: tuple[int, ...]) -> Iterator[dict[int, LoadPool]]:
    """One load pool per connection count: one worker for one connection, else two."""
    made = {count: LoadPool(1 if count == 1 else 2) for count in connections}
    try:
        yield made
    finally:
        for pool in made.values():
            pool.close()


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if args.front and haproxy() is None:
        raise SystemExit("--front needs haproxy on PATH (Debian: apt-get install haproxy)")
    settings = load_settings(args.config)
    name = next((p for p in settings.pipelines if has_dataset(p)), None)
    if name is None:
        raise SystemExit("no pipeline of this config has a demo data set under build/data")
    w = workload(settings, name)
    seconds = 1.0 if args.quick else args.seconds
    fractions, in_flight = ((0.8, 2.0, 4.0), (64,)) if args.quick else (FRACTIONS, IN_FLIGHT)
    wanted: list[tuple[str, dict | None]] = [("as configured", None)]
    if args.against:
        wanted.insert(0, (f"with {', '.join(args.against)}", overrides(args.against, settings)))
    plan = Plan(
        target="",
        method=INFER,
        requests=w.pipeline_requests,
        metadata=CLIENT,
        timeout=args.deadline,
    )
    deadline = f"every call's deadline: {args.deadline:g} s, capacity search and open loop alike"
    print(deadline, flush=True)
    with pools(args.connections) as made, ExitStack() as stack:
        systems = [stack.enter_context(started(n, args.config, g, plan)) for n, g in wanted]
        widest = (made[max(made)], max(made), seconds, in_flight)
        rates, found = searched("capacity", systems[0], *widest)
        best = max(rates.values())
        if best <= 0:
            print("no full answer at any in-flight count: nothing to sweep")
            return 1
        if args.front:
            sizing, line = front_for(args, systems[0], widest, rates, w.objective_seconds)
            fronts = [sizing, *(replace(sizing, **changed) for changed in args.front_against)]
            systems += [stack.enter_context(fronted(s, f)) for f in fronts for s in list(systems)]
            found += f"; {line}; " + searched("behind the front", systems[len(wanted)], *widest)[1]
        rates = [(f"{f:g}x", f * best) for f in fractions]
        steps = sweep(systems, made, rates, seconds, w.objective_seconds)
        crashed = [f"{f} exited ({s.name})" for s in systems if (f := s.supervisor.failed())]
    load = ", ".join(f"{n:.1f}" for n in os.getloadavg())
    table = f"{report(steps)}\n\n{found}.\n\nThe machine's load average at the end: {load}."
    print(table)
    print("; ".join(crashed) if crashed else "every process stayed up")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.md").write_text(f"# Overload sweep ({name})\n\n{deadline}.\n\n{table}\n")
    return 1 if crashed else 0


def arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/default.yaml"))
    parser.add_argument("--quick", action="store_true", help="a smoke run, about a minute")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--seconds", type=float, default=6.0, help="each step's length")
    parser.add_argument(
        "--deadline",
        type=float,
        default=1.0,
        help="every call's deadline in seconds, in the capacity search and the open loop",
    )
    parser.add_argument(
        "--against",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a gateway setting of a system to run as well and report beside (repeatable)",
    )
    parser.add_argument(
        "--front",
        action="store_true",
        help="run each system also behind HAProxy (deploy/front), in turn with it direct",
    )
    parser.add_argument(
        "--connections",
        type=connection_counts,
        default=connection_counts(CONNECTIONS),
        help=f"the open loop's numbers of connections, comma-separated (default {CONNECTIONS})",
    )
    sizing = "(default: sized from the capacity found and the objective)"
    parser.add_argument("--front-places", type=int, help=f"the front's maxconn {sizing}")
    parser.add_argument(
        "--front-queue-ms", type=int, help=f"the longest a call waits in its queue {sizing}"
    )
    parser.add_argument(
        "--front-rate",
        type=int,
        help="answers a second the front counts on to clear its queue (default: capacity found)",
    )
    parser.add_argument(
        "--front-against",
        action="append",
        default=[],
        type=front_changes,
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="another front to run beside the sized one, before the same gateway, with those "
        "of its places, queue_ms and rate changed (repeatable; e.g. places=64,queue_ms=100)",
    )
    return parser.parse_args(argv)


def front_changes(text: str) -> dict[str, int]:
    """`places=64,queue_ms=100` as the FrontSettings fields it changes."""
    changes = {}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        if key not in {"places", "queue_ms", "rate"} or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(
                f"{pair!r}: expected places, queue_ms or rate = a positive whole number"
            )
        changes[key] = int(value)
    return changes


def connection_counts(text: str) -> tuple[int, ...]:
    """`2,8` as (2, 8): distinct positive counts, in order."""
    try:
        counts = tuple(dict.fromkeys(int(part) for part in text.split(",")))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive counts, e.g. 2,8")
    return counts


if __name__ == "__main__":
    sys.exit(main())
