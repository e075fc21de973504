"""Flights in strata.calls.v1process: one run for the stacked rows, each member answered on its own,
failing members found by running them alone, and member spans only for sampled traces."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import grpc
import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from strata.calls import v1process
from strata.calls.v1process import process_all, process_all_async
from strata.errors import InvalidArgument, StrataError
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.codec import Arrays
from tests.support.flight_requests import split_flight
from tests.support.results import raise_for_result

INVALID = grpc.StatusCode.INVALID_ARGUMENT.value[0]
INTERNAL = grpc.StatusCode.INTERNAL.value[0]
TRACE = "0af7651916cd43dd8448eb211c80319c"


@dataclass
class Doubler:
    """Test-only handler: doubles `x`; refuses negative rows, divides by zero on 13, and
    refuses stacks over `max_rows`. Records the rows of every run."""

    max_rows: int = 64
    ones: bool = False  # answer one row whatever it was given (cannot be split)
    tracer: trace.Tracer = field(default_factory=lambda: trace.get_tracer("test"))
    runs: list[list[float]] = field(default_factory=list)

    def __call__(self, pipeline: str, arrays: Arrays, parameters: Mapping[str, str]):
        x = arrays["x"]
        self.runs.append(x[:, 0].tolist())
        with self.tracer.start_as_current_span("work"):
            if (x < 0).any():
                raise InvalidArgument(f"row {int(np.argmax((x < 0).any(axis=1)))} is negative")
            if (x == 13).any():
                raise ZeroDivisionError("a bug")
            if len(x) > self.max_rows:
                raise InvalidArgument(f"{len(x)} rows is over {self.max_rows}")
        y = x[:1] * 2 if self.ones else x * 2
        return {"y": y}, {"skipped_rules": "r"} if parameters.get("skip") else {}


def rows(*values: float) -> np.ndarray:
    return np.array([[v, v] for v in values], np.float32)


def flight(members: dict[str, np.ndarray], contexts: dict[str, str] | None = None, **parameters):
    """A flight of `members` (id -> its rows), stacked in order."""
    item = v1.Request(
        id="f",
        pipeline="p",
        tensors=codec.arrays_to_tensors({"x": np.concatenate(list(members.values()))}),
        parameters=parameters,
    )
    for rid, x in members.items():
        carrier = {"traceparent": contexts[rid]} if contexts and rid in contexts else {}
        item.members.add(id=rid, rows=len(x), trace_context=carrier)
    return item


def sync(handler: Doubler, *items: v1.Request) -> list[v1.Result]:
    return list(process_all(v1.ProcessRequest(requests=items), handler).results)


def concurrent(handler: Doubler, *items: v1.Request) -> list[v1.Result]:
    async def run(pipeline: str, arrays: Arrays, parameters: Mapping[str, str]):
        await asyncio.sleep(0)
        return handler(pipeline, arrays, parameters)

    request = v1.ProcessRequest(requests=items)
    return list(asyncio.run(process_all_async(request, run)).results)


DRIVERS = pytest.mark.parametrize("drive", [sync, concurrent], ids=["sync", "async"])
Drive = Callable[..., list[v1.Result]]


def answers(result: v1.Result) -> dict[str, list | tuple[int, str]]:
    """Each member's y rows, or its (code, message)."""
    out: dict[str, list | tuple[int, str]] = {}
    for member, outcome in zip(result.members, split_flight(result), strict=True):
        if isinstance(outcome, StrataError):
            out[member.id] = (member.error.code, member.error.message)
        else:
            out[member.id] = outcome["y"][:, 0].tolist()
    return out


@DRIVERS
def test_a_flight_runs_once_and_answers_each_member(drive: Drive) -> None:
    handler = Doubler()
    (result,) = drive(handler, flight({"a": rows(1), "b": rows(2, 3), "c": rows(4)}, skip="1"))
    assert handler.runs == [[1, 2, 3, 4]]
    assert [(m.id, m.rows) for m in result.members] == [("a", 1), ("b", 2), ("c", 1)]
    assert answers(result) == {"a": [2], "b": [4, 6], "c": [8]}
    assert dict(result.info) == {"skipped_rules": "r"} and not result.HasField("error")


@DRIVERS
def test_a_bad_member_fails_alone_and_the_others_run_together_again(drive: Drive) -> None:
    handler = Doubler()
    (result,) = drive(handler, flight({"a": rows(1), "bad": rows(2, -1), "c": rows(4)}))
    assert handler.runs == [[1, 2, -1, 4], [1], [2, -1], [4], [1, 4]]
    assert answers(result) == {"a": [2], "bad": (INVALID, "row 1 is negative"), "c": [8]}
    assert [m.rows for m in result.members] == [1, 0, 1]


@DRIVERS
def test_a_bug_in_the_flight_run_fails_only_its_member(drive: Drive) -> None:
    handler = Doubler()
    (result,) = drive(handler, flight({"a": rows(1), "bug": rows(13), "c": rows(-4)}))
    # Only one member left: its alone-result, no further run.
    assert handler.runs == [[1, 13, -4], [1], [13], [-4]]
    out = answers(result)
    assert out["a"] == [2] and out["c"] == (INVALID, "row 0 is negative")
    assert out["bug"][0] == INTERNAL and "server log" in out["bug"][1]


@DRIVERS
def test_members_that_succeed_alone_but_not_together_are_stacked(drive: Drive) -> None:
    handler = Doubler(max_rows=2)
    (result,) = drive(handler, flight({"a": rows(1), "b": rows(2, 3), "c": rows(4)}))
    assert handler.runs == [[1, 2, 3, 4], [1], [2, 3], [4]]
    assert answers(result) == {"a": [2], "b": [4, 6], "c": [8]}


@DRIVERS
def test_outputs_that_do_not_keep_the_rows_fail_their_members(drive: Drive) -> None:
    (result,) = drive(Doubler(ones=True), flight({"a": rows(1, 2), "b": rows(3, 4)}))
    for code, message in answers(result).values():
        assert code == INTERNAL
        assert "output 'y' has shape [1, 2], not 2 rows first" in message


@pytest.mark.parametrize(
    ("counts", "words"),
    [([1, 1], "the members' 2 rows"), ([3, 0], "member 'm1' has 0 rows")],
)
def test_a_malformed_flight_fails_every_member_without_running(counts, words) -> None:
    handler = Doubler()
    item = v1.Request(id="f", pipeline="p", tensors=codec.arrays_to_tensors({"x": rows(1, 2, 3)}))
    for i, count in enumerate(counts):
        item.members.add(id=f"m{i}", rows=count)
    (result,) = sync(handler, item)
    assert handler.runs == []
    assert all(m.error.code == INVALID and words in m.error.message for m in result.members)


@DRIVERS
def test_a_plain_request_is_unchanged_beside_a_flight(drive: Drive) -> None:
    plain = v1.Request(id="plain", pipeline="p", tensors=codec.arrays_to_tensors({"x": rows(5)}))
    bad = v1.Request(id="bad", pipeline="p", tensors=codec.arrays_to_tensors({"x": rows(-5)}))
    handler = Doubler()
    results = drive(handler, plain, flight({"a": rows(1), "b": rows(2)}), bad)
    assert [r.id for r in results] == ["plain", "f", "bad"]
    assert not results[0].members
    assert raise_for_result(results[0])["y"].tolist() == [[10, 10]]
    assert answers(results[1]) == {"a": [2], "b": [4]}
    assert not results[2].members and results[2].error.code == INVALID


@DRIVERS
def test_a_plain_request_whose_outputs_cannot_be_sent_answers_only_its_error(drive: Drive) -> None:
    def unsendable(pipeline: str, arrays: Arrays, parameters: Mapping[str, str]):
        return {"y": arrays["x"], "z": np.zeros(1, np.complex64)}, {"note": "n"}

    item = v1.Request(id="r", pipeline="p", tensors=codec.arrays_to_tensors({"x": rows(5)}))
    (result,) = drive(unsendable, item)
    assert result.id == "r" and result.error.code == INVALID
    assert "complex64" in result.error.message
    assert not result.tensors and not result.info  # not the output encoded before it failed


@dataclass
class Spans:
    tracer: trace.Tracer
    exporter: InMemorySpanExporter

    def named(self, name: str) -> list:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Spans:
    """Spans recorded in memory: strata.calls.v1process's, and the test's own (`tracer`)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(v1process, "TRACER", provider.get_tracer("strata.calls.v1process"))
    return Spans(provider.get_tracer("test"), exporter)


def test_a_flight_is_recorded_on_its_calls_span_linked_to_its_sampled_members(
    spans: Spans,
) -> None:
    sampled = f"00-{TRACE}-b7ad6b7169203331-01"
    unsampled = f"00-{'1' * 32}-b7ad6b7169203331-00"
    item = flight(
        {"bad": rows(-1), "quiet": rows(2), "plain": rows(3)},
        contexts={"bad": sampled, "quiet": unsampled},
    )
    with spans.tracer.start_as_current_span("call"):
        (result,) = sync(Doubler(tracer=spans.tracer), item)
    assert answers(result)["quiet"] == [4]
    assert not spans.named("flight p"), "the call's span is the flight's"
    assert not spans.named("request p"), "a member adds no span of its own"
    (call,) = spans.named("call")
    assert call.attributes["strata.requests"] == 3
    assert [(link.context.trace_id, link.context.span_id) for link in call.links] == [
        (int(TRACE, 16), 0xB7AD6B7169203331)
    ]
    (failed,) = [e for e in call.events if e.name == "member failed"]
    assert failed.attributes["strata.request_id"] == "bad"
    assert "negative" in failed.attributes["error.message"]
    # Every run of the handler (the flight's and the fallback's) is traced in the flight.
    work = spans.named("work")
    assert len(work) == 5 and {s.parent.span_id for s in work} == {call.context.span_id}


def test_a_flight_of_an_unsampled_call_gets_its_own_span_for_its_sampled_members(
    spans: Spans,
) -> None:
    sampled = f"00-{TRACE}-b7ad6b7169203331-01"
    item = flight({"a": rows(1), "b": rows(2)}, contexts={"a": sampled})
    (result,) = sync(Doubler(tracer=spans.tracer), item)
    assert answers(result)["b"] == [4]
    (flight_span,) = spans.named("flight p")
    assert flight_span.attributes["strata.requests"] == 2
    assert [link.context.span_id for link in flight_span.links] == [0xB7AD6B7169203331]
    work = spans.named("work")
    assert {s.parent.span_id for s in work} == {flight_span.context.span_id}


def test_an_unsampled_flight_makes_no_span_at_all(spans: Spans) -> None:
    unsampled = f"00-{TRACE}-b7ad6b7169203331-00"
    item = flight({f"m{i}": rows(1) for i in range(200)})
    for member in item.members:
        member.trace_context["traceparent"] = unsampled
    handler = Doubler(max_rows=200)
    (result,) = sync(handler, item)
    assert len(result.members) == 200 and len(handler.runs) == 1
    assert not spans.exporter.get_finished_spans()
