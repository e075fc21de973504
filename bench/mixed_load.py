"""The soak's mixed load: what a fleet of users sends at once, each kind counted apart.

- grpc: steady KServe v2 calls on a few long-lived connections, each holding at most a few
  requests in flight (bench/load's worker pool, an open loop at a fixed rate).
- rest: v2 JSON posts on HTTP/1.1 keep-alive connections, every pipeline in turn.
- churn: a new connection every so often, gRPC and HTTP in turn: opened, a few requests, closed.
- bad: a trickle of bad inputs (wrong shape, wrong datatype, short data, unknown model,
  malformed JSON), over gRPC and REST, each expecting its own clear refusal.

Each kind sends as its own client (`x-client-id: soak-<kind>`), so the gateway's refusals by
client say which kind they hit. An answer is right when it is OK or, for a bad input, when it
is the refusal its case expects (INVALID_ARGUMENT, NOT_FOUND): a bad input refused clearly is
the server doing its job. Everything else counts as failed, by status code.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import grpc
import numpy as np

from bench.load import Plan, Results
from bench.load.clients import Client, GrpcClient, HttpClient, Send
from bench.load.rest import infer_path, json_body
from bench.load.worker import INFER
from bench.workloads import Workload
from strata.proto.inference import grpc_service_pb2 as v2

OK = grpc.StatusCode.OK
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND
T = TypeVar("T")
CODE_NAMES = {code.value[0]: code.name for code in grpc.StatusCode}
UNKNOWN_MODEL = "soak-no-such-model"
# A datatype of the same width as each one, so only the declared type is wrong.
SAME_WIDTH = {
    "UINT8": "INT8", "INT8": "UINT8", "UINT16": "INT16", "INT16": "UINT16",
    "FP16": "INT16", "UINT32": "INT32", "INT32": "FP32", "FP32": "INT32",
    "UINT64": "INT64", "INT64": "FP64", "FP64": "INT64",
}  # fmt: skip


@dataclass(frozen=True)
class Mix:
    """How much of each kind the soak sends; the defaults are issue 50's mix, steady load
    well below a 2-core machine's capacity, under which the gateway once grew 14-17 MB/h."""

    grpc_rps: float = 150.0  # in all; 0: a closed loop, every connection always full
    grpc_connections: int = 4
    grpc_in_flight: int = 4  # per connection
    rest_rps: float = 40.0  # in all: 20/s on each of the two connections
    rest_connections: int = 2
    churn_seconds: float = 1.0  # a new connection this often
    churn_requests: int = 3
    bad_rps: float = 2.0  # a bad input every 0.5 s
    timeout: float = 10.0

    def describe(self) -> dict[str, str]:
        """Each kind's load, in words."""
        rate = f"{self.grpc_rps:g}/s open loop" if self.grpc_rps else "closed loop"
        return {
            "grpc": f"{rate}, {self.grpc_connections} connections x "
            f"{self.grpc_in_flight} in flight at most",
            "rest": f"{self.rest_rps:g}/s on {self.rest_connections} keep-alive connections",
            "churn": f"a new connection every {self.churn_seconds:g} s (gRPC and HTTP in "
            f"turn), {self.churn_requests} requests, closed",
            "bad": f"{self.bad_rps:g}/s bad inputs; right = the refusal each case expects",
        }


@dataclass
class Tally:
    """One kind's (or one bad case's) answers."""

    sent: int = 0
    right: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by status code name
    messages: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # seconds
    example: str | None = None  # the first right answer's error message (a refusal's)

    def add(self, code: int, expected: int, error: str | None, seconds: float) -> None:
        self.sent += 1
        self.latencies.append(seconds)
        if code == expected:
            self.right += 1
            self.example = self.example or error
            return
        self.failed[CODE_NAMES.get(code, str(code))] += 1
        if error:
            self.messages[error] += 1

    @classmethod
    def of(cls, results: Results) -> Tally:
        """The tally of a load pool's run (every request expects OK)."""
        codes, counts = np.unique(results.code, return_counts=True)
        failed = Counter(
            {CODE_NAMES[int(c)]: int(n) for c, n in zip(codes, counts, strict=True) if c}
        )
        return cls(
            sent=results.count,
            right=int(results.ok.sum()),
            failed=failed,
            messages=results.error_counts(),
            latencies=(results.latency / 1e9).tolist(),
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            self.sent + other.sent,
            self.right + other.right,
            self.failed + other.failed,
            self.messages + other.messages,
            self.latencies + other.latencies,
            self.example or other.example,
        )

    def summary(self) -> dict:
        """The figures a report shows: counts, failures and latency in ms."""
        ms = np.array(self.latencies) * 1e3
        quantiles = np.percentile(ms, [50, 99]).tolist() if len(ms) else [None, None]
        return {
            "sent": self.sent,
            "right": self.right,
            "failed": dict(self.failed.most_common()),
            "messages": dict(self.messages.most_common(5)),
            "p50_ms": quantiles[0],
            "p99_ms": quantiles[1],
            "max_ms": float(ms.max()) if len(ms) else None,
            "example": self.example,
        }


@dataclass(frozen=True)
class BadInput:
    """One bad request and the refusal it must get."""

    case: str  # e.g. "wrong shape (gRPC, digits)"
    path: str  # gRPC: the method; REST: the URL path
    body: bytes
    expected: grpc.StatusCode
    rest: bool


def steady_plan(target: str, requests: tuple[bytes, ...], mix: Mix, seconds: float) -> Plan:
    """The steady gRPC kind, for bench/load's pool."""
    return Plan(
        target=target,
        method=INFER,
        requests=requests,
        metadata=client("grpc"),
        timeout=mix.timeout,
        connections=mix.grpc_connections,
        rps=mix.grpc_rps or None,
        duration=seconds,
        concurrency=mix.grpc_connections * mix.grpc_in_flight,
    )


def interleave(groups: Sequence[Sequence[T]]) -> tuple[T, ...]:
    """Items of every group in turn (the shorter ones again from their start), so each
    pipeline sees the load all the time."""
    longest = max(len(g) for g in groups)
    return tuple(g[i % len(g)] for i in range(longest) for g in groups)


def client(kind: str) -> tuple[tuple[str, str], ...]:
    """The metadata (HTTP: headers) that names a kind's client to the gateway."""
    return (("x-client-id", f"soak-{kind}"),)


def gateway_label(kind: str) -> str:
    """A kind's client as the gateway's metrics label it (a client id header: `id:<id>`)."""
    return "id:" + dict(client(kind))["x-client-id"]


def bad_inputs(loads: Iterable[Workload]) -> list[BadInput]:
    """Every bad case for every pipeline, over gRPC and REST."""
    out = []
    for load in loads:
        good = v2.ModelInferRequest.FromString(load.pipeline_requests[0])
        out += _grpc_cases(load.pipeline, good)
        out += _rest_cases(load.pipeline, json.loads(json_body(load.pipeline_requests[0])))
    return out


def _grpc_cases(pipeline: str, good: v2.ModelInferRequest) -> list[BadInput]:
    def bad(
        case: str, change: Callable[[v2.ModelInferRequest], None], code: grpc.StatusCode
    ) -> BadInput:
        request = v2.ModelInferRequest()
        request.CopyFrom(good)
        change(request)
        name = f"{case} (gRPC, {pipeline})"
        return BadInput(name, INFER, request.SerializeToString(), code, rest=False)

    def short(r: v2.ModelInferRequest) -> None:
        r.raw_input_contents[0] = r.raw_input_contents[0][:-1]

    cases = [
        bad("wrong shape", lambda r: r.inputs[0].shape.append(1), INVALID),
        bad("short data", short, INVALID),
        bad("unknown model", lambda r: setattr(r, "model_name", UNKNOWN_MODEL), NOT_FOUND),
    ]
    other = SAME_WIDTH.get(good.inputs[0].datatype)
    if other:
        cases.append(
            bad("wrong datatype", lambda r: setattr(r.inputs[0], "datatype", other), INVALID)
        )
    return cases


def _rest_cases(pipeline: str, good: dict) -> list[BadInput]:
    path = infer_path(pipeline)

    def bad(case: str, change: Callable[[dict], None]) -> BadInput:
        body = json.loads(json.dumps(good))
        change(body["inputs"][0])
        encoded = json.dumps(body).encode()
        return BadInput(f"{case} (REST, {pipeline})", path, encoded, INVALID, rest=True)

    cases = [
        bad("wrong shape", lambda t: t["shape"].append(1)),
        bad("short data", lambda t: t["data"].pop()),
        BadInput(f"malformed JSON (REST, {pipeline})", path, b'{"inputs": [', INVALID, True),
        BadInput(
            f"unknown model (REST, {pipeline})",
            infer_path(UNKNOWN_MODEL),
            json.dumps(good).encode(),
            NOT_FOUND,
            rest=True,
        ),
    ]
    other = SAME_WIDTH.get(good["inputs"][0]["datatype"])
    if other:
        cases.append(bad("wrong datatype", lambda t: t.update(datatype=other)))
    return cases


class SideTraffic:
    """REST, churn and bad inputs for `seconds`, on one asyncio loop in a thread of its own."""

    def __init__(
        self, grpc_target: str, rest_origin: str, loads: list[Workload], mix: Mix, seconds: float
    ) -> None:
        self.grpc_target = grpc_target
        self.rest_origin = rest_origin
        self.mix = mix
        self.seconds = seconds
        self.good = interleave(
            [[(infer_path(w.pipeline), m) for m in w.pipeline_requests] for w in loads]
        )
        self.bad = bad_inputs(loads)
        self.tallies: dict[str, Tally] = {"rest": Tally(), "churn": Tally()}
        self.cases: dict[str, Tally] = {b.case: Tally() for b in self.bad}
        self.error: str | None = None  # why the traffic itself stopped early, if it did
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, name="soak-side-traffic", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Send nothing more, wait for what is in flight."""
        self._stop.set()
        self._thread.join()

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as exc:  # a bug in the load, not an answer: the soak reports it
            self.error = f"{type(exc).__name__}: {exc}"

    async def _run(self) -> None:
        end = asyncio.get_running_loop().time() + self.seconds
        await asyncio.gather(self._rest(end), self._churn(end), self._bad(end))

    def _plan(self, kind: str, path: str, rest: bool) -> Plan:
        target = self.rest_origin if rest else self.grpc_target
        return Plan(target, path, (), metadata=client(kind), timeout=self.mix.timeout)

    async def _rest(self, end: float) -> None:
        http = HttpClient(self.rest_origin, self.mix.rest_connections)
        paths = {path for path, _ in self.good}
        sends = {p: http.senders(self._plan("rest", p, True), False)[0] for p in paths}
        bodies = [(path, json_body(message)) for path, message in self.good]
        tally = self.tallies["rest"]

        async def one(i: int) -> None:
            path, body = bodies[i % len(bodies)]
            await _timed(sends[path], body, OK, tally)

        try:
            await _paced(self.mix.rest_rps, end, self._stop, one)
        finally:
            await http.close()

    async def _churn(self, end: float) -> None:
        await _paced(1 / self.mix.churn_seconds, end, self._stop, self._connection)

    async def _connection(self, i: int) -> None:
        """One short-lived connection: gRPC on even turns, HTTP on odd ones."""
        rest = i % 2 == 1
        path, message = self.good[i % len(self.good)]
        plan = self._plan("churn", path if rest else INFER, rest)
        body = json_body(message) if rest else message
        # The first request opens the connection (a refused one answers UNAVAILABLE).
        connection: Client = HttpClient(self.rest_origin, 1) if rest else GrpcClient(plan, 1)
        send = connection.senders(plan, False)[0]
        try:
            for _ in range(self.mix.churn_requests):
                await _timed(send, body, OK, self.tallies["churn"])
        finally:
            await connection.close()

    async def _bad(self, end: float) -> None:
        grpc_client = GrpcClient(self._plan("bad", INFER, False), 1)
        http = HttpClient(self.rest_origin, 1)
        sends = {}
        for bad in self.bad:
            plan = self._plan("bad", bad.path, bad.rest)
            sends[bad.case] = (http if bad.rest else grpc_client).senders(plan, False)[0]

        async def one(i: int) -> None:
            bad = self.bad[i % len(self.bad)]
            await _timed(sends[bad.case], bad.body, bad.expected, self.cases[bad.case])

        try:
            await _paced(self.mix.bad_rps, end, self._stop, one)
        finally:
            await grpc_client.close()
            await http.close()

    def bad_tally(self) -> Tally:
        """Every bad case's answers together."""
        return sum(self.cases.values(), Tally())


async def _timed(send: Send, body: bytes, expected: grpc.StatusCode, tally: Tally) -> None:
    loop = asyncio.get_running_loop()
    start = loop.time()
    code, error, _ = await send(body)
    tally.add(code, expected.value[0], error, loop.time() - start)


async def _paced(
    rate: float, end: float, stop: threading.Event, fire: Callable[[int], Awaitable[None]]
) -> None:
    """`fire(i)` at `rate` a second until `end` (loop time) or `stop`, whatever earlier ones
    do; then wait for every one to finish."""
    if rate <= 0:
        return
    loop = asyncio.get_running_loop()
    start = loop.time()
    tasks: set[asyncio.Task] = set()
    for i in itertools.count():
        due = start + i / rate
        if due >= end or stop.is_set():
            break
        await asyncio.sleep(max(0.0, due - loop.time()))
        task = loop.create_task(fire(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    await asyncio.gather(*list(tasks))
