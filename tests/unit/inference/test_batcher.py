"""The batcher with a stand-in model: batch forming, rows, shapes, limits, deadlines,
failures, and its spans."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.inference import spans
from services.inference.batcher import Batcher
from services.inference.jobs import Request
from services.inference.statistics import VersionStats
from strata.config.inference import InferenceSettings
from strata.errors import DeadlineExceeded, InvalidArgument, Overloaded
from strata.wire.deadline import Deadline

Arrays = dict[str, np.ndarray]


class Doubler:
    """Doubles `x`; records every batch; refuses negative inputs like a model that fails."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None) -> None:
        self.delay = delay
        self.gate = gate
        self.batches: list[list[tuple[int, ...]]] = []
        self.values: list[list[float]] = []  # each batch's requests, by their first value

    def __call__(self, requests: Sequence[Arrays]) -> list[Arrays]:
        self.batches.append([r["x"].shape for r in requests])
        self.values.append([float(r["x"].flat[0]) for r in requests])
        if self.gate is not None:
            self.gate.wait(5)
        time.sleep(self.delay)
        if len({r["x"].shape[1:] for r in requests}) > 1:
            raise AssertionError("requests of different shapes shared a batch")
        if any((r["x"] < 0).any() for r in requests):
            raise InvalidArgument("negative input")
        return [{"y": r["x"] * 2} for r in requests]

    @property
    def sizes(self) -> list[int]:
        return [sum(shape[0] for shape in batch) for batch in self.batches]


def batcher(
    runner: Doubler, max_rows: int = 8, concurrency: int = 1, **settings: object
) -> Batcher:
    options = InferenceSettings.Batching(**{"max_queue_delay_ms": 5.0, **settings})
    pool = ThreadPoolExecutor(max_workers=concurrency)
    stats = VersionStats("toy", "1")
    return Batcher("model 'toy' version 1", runner, pool, options, max_rows, concurrency, stats)


def x(rows: int = 1, width: int = 2, value: float = 1.0) -> Arrays:
    return {"x": np.full((rows, width), value, np.float32)}


async def submit(b: Batcher, arrays: Arrays, request: Request | None = None) -> Arrays:
    rows, width = arrays["x"].shape
    return await b.submit(arrays, rows, (width,), request or Request())


async def deadline_in(seconds: float) -> Deadline:
    return Deadline.after(seconds)


def test_a_lone_request_runs_at_once_when_idle() -> None:
    runner = Doubler()
    b = batcher(runner, max_queue_delay_ms=500)

    async def go() -> float:
        start = time.perf_counter()
        answer = await submit(b, x(value=3))
        assert answer["y"].tolist() == [[6, 6]]
        return time.perf_counter() - start

    assert asyncio.run(go()) < 0.3  # far below the 500 ms bound
    assert runner.sizes == [1]


def test_one_request_at_a_time_never_batches() -> None:
    runner = Doubler(delay=0.002)
    b = batcher(runner)

    async def go() -> None:
        for i in range(10):
            assert (await submit(b, x(value=i)))["y"][0, 0] == 2 * i

    asyncio.run(go())
    assert runner.sizes == [1] * 10


@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_batches_form_under_concurrent_load_and_answers_stay_apart(policy: str) -> None:
    runner = Doubler(delay=0.005)
    b = batcher(runner, max_rows=8, concurrency=2, policy=policy)

    async def go() -> list[Arrays]:
        return await asyncio.gather(*(submit(b, x(value=i)) for i in range(40)))

    answers = asyncio.run(go())
    assert [a["y"][0, 0] for a in answers] == [2 * i for i in range(40)]
    assert max(runner.sizes) > 1
    assert max(runner.sizes) <= 8
    assert b._stats.batch_sizes.total() == len(runner.batches)


def test_no_batching_policy_runs_every_request_alone() -> None:
    runner = Doubler(delay=0.002)
    b = batcher(runner, policy="none")

    async def go() -> None:
        await asyncio.gather(*(submit(b, x()) for _ in range(12)))

    asyncio.run(go())
    assert runner.sizes == [1] * 12


def test_rows_count_and_never_exceed_the_max_batch_size() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_rows=8)

    async def go() -> None:
        first = asyncio.ensure_future(submit(b, x(rows=1)))
        await asyncio.sleep(0.01)  # the first holds the only slot; the rest queue
        rest = [asyncio.ensure_future(submit(b, x(rows=r))) for r in (5, 3, 2, 6, 1)]
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(go())
    # 5+3 fill a batch of 8; 2+6 fill the next; the 1 row left runs last.
    assert runner.sizes == [1, 8, 8, 1]
    assert b._stats.inference_count == 18


def test_requests_of_different_shapes_never_share_a_batch() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_rows=16)

    async def go() -> None:
        first = asyncio.ensure_future(submit(b, x(width=2)))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(submit(b, x(width=2 + i % 3))) for i in range(9)]
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(go())  # Doubler raises if two shapes ever shared a batch
    assert sorted(runner.sizes[1:]) == [3, 3, 3]


def test_a_full_queue_refuses_at_once() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_queue_rows=4)

    async def go() -> list[object]:
        first = asyncio.ensure_future(submit(b, x()))
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(submit(b, x(rows=2))) for _ in range(2)]
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        with pytest.raises(Overloaded, match="queue full") as full:
            await submit(b, x())
        assert time.perf_counter() - start < 0.5  # the gate holds the queue shut until later
        assert full.value.retry_after > 0, "the refusal says when to come back"
        gate.set()
        return await asyncio.gather(first, *queued)

    assert len(asyncio.run(go())) == 3
    assert b._stats.rejected["queue_full"] == 1


def test_a_passed_deadline_is_refused_without_running() -> None:
    runner = Doubler()
    b = batcher(runner)

    async def go() -> None:
        with pytest.raises(DeadlineExceeded, match="deadline passed"):
            await submit(b, x(), Request(deadline=await deadline_in(-0.001)))

    asyncio.run(go())
    assert runner.batches == []
    assert b._stats.rejected["deadline"] == 1


@pytest.mark.timing
def test_a_deadline_the_queue_cannot_meet_is_refused_at_once() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_rows=2)
    for _ in range(5):
        b.execution.observe(2, 0.05)  # a batch takes 50 ms

    async def go() -> None:
        first = asyncio.ensure_future(submit(b, x()))
        await asyncio.sleep(0.01)
        queued = [asyncio.ensure_future(submit(b, x(rows=2))) for _ in range(3)]
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        with pytest.raises(DeadlineExceeded, match="6 rows queued ahead"):
            await submit(b, x(), Request(deadline=await deadline_in(0.1)))
        assert time.perf_counter() - start < 0.1  # refused before its deadline came
        roomy = asyncio.ensure_future(submit(b, x(), Request(deadline=await deadline_in(5))))
        gate.set()
        await asyncio.gather(first, *queued, roomy)

    asyncio.run(go())
    assert sum(runner.sizes) == 8  # the refused request never ran


def test_a_queued_request_whose_deadline_passes_is_dropped_before_running() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner)

    async def go() -> None:
        first = asyncio.ensure_future(submit(b, x()))
        await asyncio.sleep(0.01)
        late = asyncio.ensure_future(submit(b, x(), Request(deadline=await deadline_in(0.02))))
        await asyncio.sleep(0.05)
        gate.set()
        await first
        with pytest.raises(DeadlineExceeded, match="waited"):
            await late

    asyncio.run(go())
    assert runner.sizes == [1]


def test_higher_priority_goes_first() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, policy="none")

    async def go() -> None:
        first = asyncio.ensure_future(submit(b, x(value=0)))
        await asyncio.sleep(0.01)
        low = [asyncio.ensure_future(submit(b, x(value=3), Request(priority=3)))]
        normal = [asyncio.ensure_future(submit(b, x(value=2)))]
        high = [asyncio.ensure_future(submit(b, x(value=1), Request(priority=1)))]
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(first, *low, *normal, *high)

    order: list[float] = []
    original = runner.__call__

    def recording(requests: Sequence[Arrays]) -> list[Arrays]:
        order.extend(float(r["x"][0, 0]) for r in requests)
        return original(requests)

    b._runner = recording
    asyncio.run(go())
    assert order == [0, 1, 2, 3]


def test_a_poisoned_request_fails_alone() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_rows=8)

    async def go() -> list[object]:
        first = asyncio.ensure_future(submit(b, x(value=1)))
        await asyncio.sleep(0.01)
        batch = [submit(b, x(value=-1 if i == 3 else i)) for i in range(6)]
        tasks = [asyncio.ensure_future(c) for c in batch]
        await asyncio.sleep(0.01)
        gate.set()
        await first
        return await asyncio.gather(*tasks, return_exceptions=True)

    outcomes = asyncio.run(go())
    assert isinstance(outcomes[3], InvalidArgument)
    assert [o["y"][0, 0] for i, o in enumerate(outcomes) if i != 3] == [0, 2, 4, 8, 10]
    assert runner.sizes[1] == 6  # they did run as one batch before the retry
    assert b._stats.fail.count == 1 and b._stats.success.count == 6


def test_skip_batching_runs_alone_without_waiting() -> None:
    runner = Doubler()
    b = batcher(runner, max_rows=8, concurrency=2, policy="fixed", max_queue_delay_ms=1000)

    async def go() -> float:
        waiting = asyncio.ensure_future(submit(b, x()))  # waits for the 1 s window
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        answer = await submit(b, x(value=5), Request(skip_batching=True))
        took = time.perf_counter() - start
        assert answer["y"][0, 0] == 10 and not waiting.done()
        await waiting
        return took

    assert asyncio.run(go()) < 0.5
    assert runner.sizes == [1, 1]


def test_close_runs_what_is_queued_then_drains() -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_rows=4)

    async def go() -> None:
        tasks = [asyncio.ensure_future(submit(b, x(value=i))) for i in range(6)]
        await asyncio.sleep(0.01)
        b.close()
        gate.set()
        await asyncio.wait_for(b.drained(), 5)
        assert [t.result()["y"][0, 0] for t in tasks] == [0, 2, 4, 6, 8, 10]

    asyncio.run(go())


def test_a_batch_is_a_span_of_its_own_linked_to_its_requests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(spans, "_tracer", tracer)
    gate = threading.Event()
    b = batcher(Doubler(gate=gate), max_rows=8)

    async def traced(i: int) -> None:
        with tracer.start_as_current_span(f"request {i}"):
            await submit(b, x(value=i))

    async def go() -> None:
        first = asyncio.ensure_future(traced(0))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(traced(i)) for i in (1, 2, 3)]
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(first, *rest)

    asyncio.run(go())
    finished = {s.name: s for s in exporter.get_finished_spans()}
    batches = [s for s in exporter.get_finished_spans() if s.name == "inference batch"]
    (batch,) = [s for s in batches if s.attributes["batch.requests"] == 3]
    requests = [finished[f"request {i}"] for i in (1, 2, 3)]
    assert batch.parent is None
    assert batch.context.trace_id not in {r.context.trace_id for r in requests}
    assert {link.context.span_id for link in batch.links} == {r.context.span_id for r in requests}
    for request in requests:
        assert request.attributes["strata.batch_span_id"] == f"{batch.context.span_id:016x}"
        assert request.attributes["strata.batch_rows"] == 3
        assert request.attributes["strata.queue_ms"] > 0


def test_a_batch_of_one_calls_requests_is_recorded_on_that_calls_span(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lone request, and a flight's members queued by one call: no batch span, the call's
    span has the batch's attributes and links to each member's span with its queue time."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    monkeypatch.setattr(spans, "_tracer", tracer)
    b = batcher(Doubler(), max_rows=8, max_queue_delay_ms=0.0)
    members = [tracer.start_span(f"member {i}") for i in range(3)]

    async def go() -> None:
        with tracer.start_as_current_span("lone call"):
            await submit(b, x(value=1))
        with tracer.start_as_current_span("flight call"):
            await asyncio.gather(
                *(
                    b.submit(x(value=i), 1, (2,), Request(), link=m.get_span_context())
                    for i, m in enumerate(members)
                )
            )

    asyncio.run(go())
    finished = {s.name: s for s in exporter.get_finished_spans()}
    assert "inference batch" not in finished
    lone, flight = finished["lone call"], finished["flight call"]
    assert (lone.attributes["batch.requests"], lone.attributes["batch.rows"]) == (1, 1)
    assert (lone.attributes["strata.model"], lone.attributes["strata.model_version"]) == (
        "toy",
        "1",
    )
    assert lone.attributes["batch.compute_ms"] >= 0 and not lone.links
    assert "strata.batch_span_id" not in lone.attributes
    assert flight.attributes["batch.requests"] == 3
    assert {link.context.span_id for link in flight.links} == {
        m.get_span_context().span_id for m in members
    }
    assert all(link.attributes["strata.queue_ms"] >= 0 for link in flight.links)
    assert flight.status.is_ok  # the call's status is its own, not the batch's


@pytest.mark.parametrize(
    ("max_padding", "batches"),
    [
        # Padded to 50, the short ones would make a batch of 3 rows more than half padding.
        (0.5, [[0.0], [1.0, 2.0], [3.0, 4.0]]),
        (1.0, [[0.0], [1.0, 2.0, 3.0, 4.0]]),  # no cap: any lengths share a batch
    ],
)
def test_requests_of_far_apart_lengths_wait_for_a_batch_nearer_their_own(
    max_padding: float, batches: list[list[float]]
) -> None:
    gate = threading.Event()
    runner = Doubler(gate=gate)
    b = batcher(runner, max_padding=max_padding)

    async def go() -> None:
        first = asyncio.ensure_future(b.submit(x(value=0), 1, (2,), Request(), 10))
        await asyncio.sleep(0.01)
        queued = [
            asyncio.ensure_future(b.submit(x(value=v), 1, (2,), Request(), length))
            for v, length in {1: 10, 2: 12, 3: 50, 4: 50}.items()
        ]
        await asyncio.sleep(0.01)
        gate.set()
        await asyncio.gather(first, *queued)

    asyncio.run(go())
    assert runner.values == batches


class Where(Doubler):
    """A Doubler that notes the thread each batch ran on."""

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay)
        self.threads: list[int] = []

    def __call__(self, requests: Sequence[Arrays]) -> list[Arrays]:
        self.threads.append(threading.get_ident())
        return super().__call__(requests)


@pytest.mark.parametrize(
    ("delay", "inline_max_ms", "on_loop"),
    [(0.0, 5.0, True), (0.0, 0.0, False), (0.02, 5.0, False)],
    ids=["short-runs-inline", "inline-off", "long-runs-on-a-worker"],
)
def test_a_batch_runs_on_the_loop_only_when_measured_shorter_than_a_hand_off(
    delay: float, inline_max_ms: float, on_loop: bool
) -> None:
    runner = Where(delay)
    b = batcher(runner, inline_max_ms=inline_max_ms)

    async def go() -> int:
        for _ in range(20):
            await submit(b, x())
        return threading.get_ident()

    loop_thread = asyncio.run(go())
    assert runner.threads[0] != loop_thread, "a batch not yet measured runs on a worker"
    assert all((t == loop_thread) is on_loop for t in runner.threads[-5:])
