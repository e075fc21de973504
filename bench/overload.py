"""Overload: `python -m bench.overload --config configs/default.yaml [--quick] [--against K=V]`.

What a user past capacity sees. The system from the config on free ports, the ladder free; the
first pipeline with a demo data set. Every call carries the same deadline (`--deadline`, 1 s),
in the capacity search and the open loop alike, so that the sweep measures the server and no
change of deadline between its phases. Capacity is the best goodput (full answers within the
pipeline's objective, per second) of closed loops of 16 and 64 in flight from the most
connections asked for (the issue's definition); the best rate of full answers however late is
printed beside it as the measure before. Then an open loop (no coordinated omission) at 0.8, 1,
1.5, 2 and 4x that rate from each number of connections in `--connections` (by default 2 and 8,
the issue's figure; one load worker for one connection or for the compiled sender, else two
sharing them), each step once the ladder is calm again. Per step: goodput and its share of the
capacity the rates come from, of the system's own capacity (each system's searched the same
way, through its front where it has one) and of the best step's, the P99 of admitted requests
(answered, full or degraded), the share refused (RESOURCE_EXHAUSTED or UNAVAILABLE) and the P99
of the time a refusal took, the degraded share, other errors, the highest level the ladder
reached, the slowest health answer (a gRPC health check on the public port, behind every call
gRPC has queued there; the same on the admin port; GET /readyz on the metrics port), how late
the load tool's sends were (P99) and the cores it took, its workers together (it shares the
machine's cores with what it measures). The load tool sends through its compiled sender where
`make load-sender` built it (a third to a half of Python's CPU per call), else through Python;
the first line says which (`--sender` chooses).

`--front` (haproxy on PATH) also sends every step through HAProxy before the same gateway
(deploy/front/haproxy.cfg), in turn with the direct runs, so that the two are compared under
the same machine load. The front is fitted past capacity (bench/front.py
`FrontSettings.sized`: places for a fifth of the objective in the gateway at a rate, a queue
of a twentieth of it, refused on arrival past what that rate clears in that wait), fed the rate
the gateway clears behind the front in an open loop at 2x capacity, where the load tool and
HAProxy take cores a closed loop left it: sized from the capacity first, then refitted from
each such loop's cleared rate until the places settle, places / cleared (a call's time in
the gateway, by Little's law, the places all taken) near a fifth of the objective (at most
three loops; a cut of the places that clears less by more than a fifth keeps the places
before it). That fifth is a ceiling: the places are then cut by a quarter at a time, each cut
sent the same loop, while they clear 95% of the best rate seen, since places past those that
keep the gateway at its rate only lengthen every admitted call. `--front-places`,
`--front-queue-ms` and `--front-rate` override each (places and rate both given: no fit), and
the variables a deployment sets are printed and reported.
`--front-against places=64,queue_ms=100` runs another front beside it before the same
gateway, with those values changed, so that two sizings meet the same machine load. Each
front step also reports HAProxy's own average time in its queue and in the gateway over its
last 1,024 calls, so that an admitted call's latency reads as the two. The steps' rates stay
the direct gateway's capacity's for every system, so that all meet the same load.

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
from bench.front import IN_GATEWAY, FrontSettings, counters, front, haproxy
from bench.load import LoadPool, Plan, Results, native
from bench.load.options import SENDERS
from bench.load.worker import INFER
from bench.measure import closed, opened
from bench.workloads import has_dataset, workload
from strata.config import load_settings
from strata.tools.launch import Supervisor

RESULTS = Path(__file__).resolve().parent / "results"
CLIENT = (("x-client-id", "strata-bench"),)
FRACTIONS = (0.8, 1.0, 1.5, 2.0, 4.0)
IN_FLIGHT = (16, 64)  # the capacity: the best closed loop of these
CONNECTIONS = "2,8"  # the figure; 1 costs a sweep more
REFUSED = (grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], grpc.StatusCode.UNAVAILABLE.value[0])
CALM_SECONDS = 30.0  # the most a step waits for the ladder to come back to level 0
FIT_LOAD = 2.0  # of capacity: the open loop the front is fitted under, past capacity
FIT_ROUNDS = 3  # such loops at most to fit the front's places to the time they take
FIT_CLOSE = 0.2  # places this near those measured have settled
NARROW_ROUNDS = 5  # cuts at most of the fitted places, while they clear the same rate
NARROW_STEP = 0.75  # each cut keeps this share of the places
NARROW_HOLDS = 0.95  # of the best rate cleared so far: fewer places that clear this keep it


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
    client_cores: float  # the machine's cores the load tool took, its workers together
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
        client_cores=client["cores"],
    )


_REFUSED_NAMES = {"ResourceExhausted", "Unavailable"}


def _p99(values: np.ndarray) -> float:
    return float(np.percentile(values, 99)) if len(values) else float("nan")


@dataclass(frozen=True)
class Capacity:
    """What closed loops of each number of calls in flight reached a second: full answers
    within the objective (goodput, the issue's capacity) and full answers however late (the
    measure before it, reported beside it)."""

    goodput: dict[int, float]
    full: dict[int, float]

    @property
    def best(self) -> float:
        """The capacity: the best goodput of the loops."""
        return max(self.goodput.values())

    def line(self, what: str, objective: float) -> str:
        return (
            f"{what} (the best of {tuple(self.goodput)} in flight, full answers within the "
            f"{objective * 1e3:g} ms objective): {self.best:.0f}/s; full answers however "
            f"late, the measure before: {max(self.full.values()):.0f}/s"
        )


def full_rate(results: Results) -> float:
    """Full answers (not degraded), however late, per second."""
    seconds = results.total_seconds
    full = results.ok & (results.flags & 1 == 0)
    return float(full.sum()) / seconds if seconds else 0.0


def capacity(
    pool: LoadPool, plan: Plan, seconds: float, in_flight: tuple[int, ...], objective: float
) -> Capacity:
    """The rates a closed loop of each of `in_flight` requests reaches."""
    found = Capacity({}, {})
    for count in in_flight:
        results = closed(pool, plan, count, seconds)
        found.goodput[count] = results.goodput(objective)
        found.full[count] = full_rate(results)
        print(
            f"closed loop, {count} in flight: {found.goodput[count]:.0f} full answers/s within "
            f"the objective ({found.full[count]:.0f} however late)",
            flush=True,
        )
    return found


def searched(
    what: str,
    system: System,
    pool: LoadPool,
    connections: int,
    seconds: float,
    in_flight: tuple[int, ...],
    objective: float,
) -> tuple[Capacity, str]:
    """`system`'s capacity from `connections`, once its ladder is calm, and a line that says
    it as `what`."""
    system.calm()
    plan = replace(system.plan, connections=connections)
    found = capacity(pool, plan, seconds, in_flight, objective)
    line = found.line(what, objective)
    print(line, flush=True)
    return found, line


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
        self.calm()
        since = time.time()
        with HealthProbe(self.plan.target, *self.probes) as probe:
            results = opened(pool, replace(self.plan, connections=connections), rate, seconds)
        step = measured(self.name, label, results, objective)
        step.level = self.levels.highest(since, time.time())
        step.health_ms = tuple(seconds * 1e3 for seconds in probe.slowest())
        if self.front_metrics is not None:
            step.front_ms = front_times(self.front_metrics)
        return step

    def calm(self) -> None:
        """Until the ladder is back at level 0 with nothing in flight (said if it is not),
        so that a run starts from where the one before it left no trace."""
        time.sleep(1.0)
        if not self.admin.wait_calm(CALM_SECONDS):
            print(f"{self.name}: the ladder was not calm within {CALM_SECONDS:.0f} s")


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
        threads = "" if settings.threads is None else f", {settings.threads} threads"
        name = (
            f"{system.name}, behind the front ({settings.places} places, "
            f"{settings.queue_ms} ms, {settings.rate}/s{threads})"
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
        f"sends late P99 {step.late_p99_ms:.1f} ms, load tool {step.client_cores:.2f} cores"
        f"{_front_text(step)}"
    )


def _front_text(step: Step) -> str:
    if step.front_ms is None:
        return ""
    queued, served = step.front_ms
    return f", the front's averages: {queued:.0f} ms queued, {served:.0f} ms in the gateway"


HEADER = (
    "| connections | load | system | offered/s | goodput/s | of capacity | of own capacity "
    "| % of peak | admitted P99 ms | refused | refusal P99 ms | degraded | other errors "
    "| top level | slowest health ms: public port | admin port | /readyz | sends late P99 ms "
    "| busiest client worker | load tool's cores | front's average ms: queued "
    "| in the gateway |\n"
    "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:"
    "|---:|---:|---:|---:|"
)


def report(steps: list[Step], capacity: float, own: dict[str, float]) -> str:
    """One table, each step's systems side by side; goodput as a share of `capacity` (the one
    the rates are shares of), of its system's `own` capacity, and of its best step's, each only
    where it is above 0 (no peak: said so)."""
    peaks: dict[tuple[str, int], float] = {}
    for step in steps:
        key = (step.system, step.connections)
        peaks[key] = max(peaks.get(key, 0.0), step.goodput)
    order = {label: n for n, label in enumerate(dict.fromkeys(s.label for s in steps))}
    ordered = sorted(steps, key=lambda s: (s.connections, order[s.label]))
    lines = [HEADER]
    for step in ordered:
        shares = (capacity, own.get(step.system, 0.0), peaks[(step.system, step.connections)])
        lines.append(_row(step, tuple(_share(step.goodput, whole) for whole in shares)))
    lines += [
        f"\nNo step of {system} from {connections} connection(s) had a full answer within "
        "the objective: there is no peak goodput to compare with."
        for (system, connections), peak in peaks.items()
        if peak <= 0
    ]
    return "\n".join(lines)


def _share(part: float, whole: float) -> str:
    return f"{part / whole:.2f}" if whole > 0 else "-"


def _row(step: Step, shares: tuple[str, str, str]) -> str:
    refusal = "-" if np.isnan(step.refusal_p99_ms) else f"{step.refusal_p99_ms:.1f}"
    public, admin, readyz = step.health_ms
    other = ", ".join(f"{code} {n}" for code, n in step.other_errors.items()) or "-"
    level = "-" if step.level is None else step.level
    queued, served = ("-", "-") if step.front_ms is None else (f"{t:.0f}" for t in step.front_ms)
    return (
        f"| {step.connections} | {step.label} | {step.system} | {step.offered:.0f} | "
        f"{step.goodput:.0f} | {' | '.join(shares)} | {step.admitted_p99_ms:.0f} | "
        f"{step.refused:.0%} | {refusal} | {step.degraded:.0%} | {other} | {level} | "
        f"{public:.0f} | {admin:.0f} | {readyz:.0f} | {step.late_p99_ms:.1f} | "
        f"{step.busiest:.0%} | {step.client_cores:.2f} | {queued} | {served} |"
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
    capacity: float,
    objective: float,
) -> FrontSettings:
    """The front for `system`: places for its share of `objective` in the gateway at the rate
    the gateway clears behind the front in an open loop past capacity (FIT_LOAD x
    `capacity`), and that rate. Past capacity the load tool and HAProxy take cores that a
    closed loop left the gateway, so it clears less there than a closed loop reaches, and
    places sized from the closed loop hold each call longer than the share. Sized from
    `capacity` first, then from each round's cleared rate until the places settle (at most
    FIT_ROUNDS rounds); only the places change between rounds."""
    sizing = FrontSettings.sized(capacity, objective)
    measured = None
    for attempt in range(FIT_ROUNDS):
        cleared = _cleared(system, pool, connections, seconds, capacity, sizing)
        # Past capacity every place is taken (the queue holds a wait's worth), so by Little's
        # law a call spends places / cleared in the gateway. HAProxy's own average is no
        # reading in a fresh front: its Prometheus page divides the sum of the times it has
        # by 1,024 however few calls that sum holds, and later calls only slowly replace the
        # shortfall (it read 50 ms where places / cleared was 122 ms in a 1 s round).
        in_gateway = sizing.places / cleared * 1e3 if cleared > 0 else float("nan")
        print(
            f"the front at {sizing.places} places, {FIT_LOAD:g}x capacity: the gateway cleared "
            f"{cleared:.0f}/s, {in_gateway:.0f} ms a call in it (its share of the objective: "
            f"{objective * IN_GATEWAY * 1e3:.0f} ms)",
            flush=True,
        )
        refit, done = next_fit(sizing, cleared, objective, measured)
        measured = replace(sizing, rate=max(1, round(cleared)))
        if done or attempt == FIT_ROUNDS - 1:
            # More places than measured clear at least as much; fewer are not yet known to.
            fit = refit if done or refit.places > sizing.places else measured
            return narrowed(system, pool, connections, seconds, capacity, fit)
        sizing = refit
    raise AssertionError("unreachable: the last round returns")


def narrowed(
    system: System,
    pool: LoadPool,
    connections: int,
    seconds: float,
    capacity: float,
    fit: FrontSettings,
) -> FrontSettings:
    """The fewest places, cutting `fit`'s by NARROW_STEP at most NARROW_ROUNDS times, that
    still clear NARROW_HOLDS of the best rate cleared so far. The objective's share is a
    ceiling: past capacity each admitted call spends places / rate in the gateway, so places
    beyond those that keep the gateway at its rate only lengthen every call (52 places held
    each 27-30 ms where 25 held each 13, at the same rate: docs/deploy.md)."""
    best = fit.rate
    for _ in range(NARROW_ROUNDS):
        fewer = replace(fit, places=max(1, round(fit.places * NARROW_STEP)))
        if fewer.places == fit.places:
            break
        cleared = _cleared(system, pool, connections, seconds, capacity, fewer)
        held = holding(best, fewer, cleared)
        print(
            f"the front at {fewer.places} places: the gateway cleared {cleared:.0f}/s "
            f"({'it holds' if held else 'less'} against the best, {best:.0f}/s)",
            flush=True,
        )
        if held is None:
            break
        fit, best = held, max(best, cleared)
    return fit


def holding(best: float, fewer: FrontSettings, cleared: float) -> FrontSettings | None:
    """`fewer` places at the rate they cleared, where that is at least NARROW_HOLDS of the
    `best` rate cleared so far; None where they cost the gateway its rate."""
    if cleared < NARROW_HOLDS * best:
        return None
    return replace(fewer, rate=max(1, round(cleared)))


def _cleared(
    system: System,
    pool: LoadPool,
    connections: int,
    seconds: float,
    capacity: float,
    sizing: FrontSettings,
) -> float:
    """The rate the gateway clears behind a front of `sizing` under an open loop past
    capacity (FIT_LOAD x `capacity`)."""
    system.calm()
    # The queue's bound on arrival stays the capacity's: a bound from a lower rate refuses
    # bursts that the places could have taken, and the round would measure the front.
    with fronted(system, replace(sizing, rate=round(capacity))) as behind:
        plan = replace(behind.plan, connections=connections)
        return opened(pool, plan, FIT_LOAD * capacity, seconds).throughput()


def next_fit(
    sizing: FrontSettings, cleared: float, objective: float, before: FrontSettings | None
) -> tuple[FrontSettings, bool]:
    """After a fitting round at `sizing` in which the gateway cleared `cleared` answers a
    second: the sizing that rate calls for, and whether it is the fit (places within
    FIT_CLOSE of those measured: a call's time in the gateway near its share). `before` is
    the round before, its places and the rate they cleared: where fewer places than it had
    cleared less by more than FIT_CLOSE, the gateway needs those places (its own time a
    call is past the share, which no cut of the places shortens), and `before` is the fit.
    No answer to size from: `before`, or `sizing` in the first round."""
    if cleared <= 0:
        print("no answer through the front: it keeps the sizing it had")
        return before or sizing, True
    if before and sizing.places < before.places and cleared < (1 - FIT_CLOSE) * before.rate:
        print(f"fewer places cleared less: the fit keeps {before.places} places")
        return before, True
    refit = FrontSettings.sized(cleared, objective)
    return refit, abs(refit.places - sizing.places) <= FIT_CLOSE * sizing.places


def front_for(
    args: argparse.Namespace,
    system: System,
    widest: tuple,
    capacity: float,
    objective: float,
) -> tuple[FrontSettings, str]:
    """The front to run before `system`: fitted past its `capacity` to the objective (unless
    the command line gave both places and rate), any value the command line gave in place of
    the fitted one; and a line that says what a deployment sets."""
    pool, connections, seconds, _ = widest
    given = {"places": args.front_places, "queue_ms": args.front_queue_ms, "rate": args.front_rate}
    if args.front_places is None or args.front_rate is None:
        fitted = fitted_front(system, pool, connections, seconds, capacity, objective)
    else:
        fitted = FrontSettings.sized(capacity, objective)
    sizing = replace(fitted, **{key: value for key, value in given.items() if value is not None})
    variables = " ".join(f"{key}={value}" for key, value in sizing.variables().items())
    line = f"the front, fitted to it and the {objective * 1e3:g} ms objective: {variables}"
    print(line, flush=True)
    return sizing, line


@contextmanager
def pools(connections: tuple[int, ...], compiled: bool) -> Iterator[dict[int, LoadPool]]:
    """One load pool per connection count: one worker for one connection, else two; one for
    the compiled sender, which keeps 4x capacity in one thread and costs less a call in one
    process than in two (0.15 against 0.17 ms at 1,200/s)."""
    made = {count: LoadPool(1 if count == 1 or compiled else 2) for count in connections}
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
    fractions = (0.8, 2.0, 4.0) if args.quick else FRACTIONS
    wanted: list[tuple[str, dict | None]] = [("as configured", None)]
    if args.against:
        wanted.insert(0, (f"with {', '.join(args.against)}", overrides(args.against, settings)))
    plan = Plan(
        target="",
        method=INFER,
        requests=w.pipeline_requests,
        metadata=CLIENT,
        timeout=args.deadline,
        sender=args.sender,
    )
    deadline = f"every call's deadline: {args.deadline:g} s, capacity search and open loop alike"
    try:
        sender = native.described(plan)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    print(f"{deadline}; {sender}", flush=True)
    objective = w.objective_seconds
    compiled = native.resolve(plan).sender == "compiled"
    with pools(args.connections, compiled) as made, ExitStack() as stack:
        systems = [stack.enter_context(started(n, args.config, g, plan)) for n, g in wanted]
        widest = (made[max(made)], max(made), seconds, IN_FLIGHT)
        own, found = capacities(systems, widest, objective)
        best = own[systems[0].name]
        if best <= 0:
            print("no full answer within the objective at any in-flight count: nothing to sweep")
            return 1
        if args.front:
            sizing, line = front_for(args, systems[0], widest, best, objective)
            fronts = [sizing, *(replace(sizing, **changed) for changed in args.front_against)]
            behind = [stack.enter_context(fronted(s, f)) for f in fronts for s in list(systems)]
            more, lines = capacities(behind, widest, objective)
            own |= more
            found += [line, *lines]
            systems += behind
        rates = [(f"{f:g}x", f * best) for f in fractions]
        steps = sweep(systems, made, rates, seconds, objective)
        after, _ = searched(
            f"{systems[0].name}: capacity after the sweep", systems[0], *widest, objective
        )
        crashed = [f"{f} exited ({s.name})" for s in systems if (f := s.supervisor.failed())]
    load = ", ".join(f"{n:.1f}" for n in os.getloadavg())
    table = (
        f"{report(steps, best, own)}\n\n{'; '.join(found)}.\n\nEvery step's rate is a share "
        f"of {best:.0f}/s, the capacity of {systems[0].name}. {drift(best, after.best)} The "
        f"machine has {os.cpu_count()} cores; its load average at the end: {load}."
    )
    print(table)
    print("; ".join(crashed) if crashed else "every process stayed up")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overload.md").write_text(
        f"# Overload sweep ({name})\n\n{deadline}; {sender}.\n\n{table}\n"
    )
    return 1 if crashed else 0


DRIFT = 0.1  # capacity moved by more than this share during a sweep: its shares read the machine


def drift(before: float, after: float) -> str:
    """What the same capacity search found after the sweep, and whether the machine's speed
    moved enough during it that the steps' shares of the first search read the machine as
    much as the system."""
    moved = after / before - 1 if before > 0 else float("nan")
    said = f"The same search after the sweep found {after:.0f}/s ({moved:+.0%})"
    if abs(moved) > DRIFT:
        return f"{said}: **the machine's speed moved during the sweep**; its shares are no result."
    return f"{said}."


def capacities(
    systems: list[System], widest: tuple, objective: float
) -> tuple[dict[str, float], list[str]]:
    """Each system's capacity by its name, searched from the most connections, and the lines
    that say them."""
    found = {}
    lines = []
    for system in systems:
        capacity, line = searched(f"{system.name}: capacity", system, *widest, objective)
        found[system.name] = capacity.best
        lines.append(line)
    return found, lines


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
    parser.add_argument(
        "--sender",
        default="auto",
        choices=SENDERS,
        help="the load tool's sender: compiled (build/load-sender, `make load-sender`), python, "
        "or auto (default): compiled where built",
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
        "of its places, queue_ms, rate and threads (HAProxy's nbthread) changed (repeatable; "
        "e.g. places=64,queue_ms=100 or threads=2)",
    )
    return parser.parse_args(argv)


FRONT_FIELDS = {"places", "queue_ms", "rate", "threads"}


def front_changes(text: str) -> dict[str, int]:
    """`places=64,queue_ms=100` as the FrontSettings fields it changes."""
    changes = {}
    for pair in text.split(","):
        key, _, value = pair.partition("=")
        if key not in FRONT_FIELDS or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(
                f"{pair!r}: expected places, queue_ms, rate or threads = a positive whole number"
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
