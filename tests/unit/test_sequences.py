"""Sequences without sockets: a request's flags, and the live sequences of one model or
pipeline (order, START/END, scope, limits, idle timeout)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine

import pytest

from strata.errors import InvalidArgument, Overloaded
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.triton_sequences import Flags, Live, sequence_flags


def synchronously(test: Callable[[], Coroutine]) -> Callable[[], None]:
    """Run an async test on a loop of its own."""
    return functools.wraps(test)(lambda: asyncio.run(test()))


def parameters(**values: object) -> dict[str, v2.InferParameter]:
    request = v2.ModelInferRequest()
    for key, value in values.items():
        field = {bool: "bool_param", int: "uint64_param", str: "string_param"}[type(value)]
        setattr(request.parameters[key], field, value)
    return dict(request.parameters)


def test_a_request_of_no_sequence_has_no_flags() -> None:
    assert sequence_flags(parameters()) is None
    assert sequence_flags(parameters(sequence_id=0)) is None
    assert sequence_flags(parameters(sequence_id="")) is None


def test_flags_take_uint64_and_string_ids() -> None:
    assert sequence_flags(parameters(sequence_id=7, sequence_start=True)) == Flags(7, True)
    assert sequence_flags(parameters(sequence_id="a", sequence_end=True)) == Flags("a", end=True)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"sequence_start": True}, "need a sequence_id"),
        ({"sequence_id": 1, "sequence_end": "yes"}, "'sequence_end' must be a bool"),
        ({"sequence_id": True}, "must be a uint64 or a string, got bool_param"),
        ({"sequence_id": "x" * 300}, "longer than 256 characters"),
    ],
)
def test_bad_flags_are_refused_naming_why(values: dict, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        sequence_flags(parameters(**values))


def test_a_negative_int64_id_is_refused() -> None:
    request = v2.ModelInferRequest()
    request.parameters["sequence_id"].int64_param = -3
    with pytest.raises(InvalidArgument, match="must not be negative"):
        sequence_flags(request.parameters)


async def step(live: Live[list], flags: Flags, log: list, item: object, pause: float = 0) -> None:
    async with live.turn(flags, list) as entry:
        await asyncio.sleep(pause)
        entry.value.append(item)
        log.append(item)


@synchronously
async def test_requests_of_one_sequence_run_one_at_a_time_in_arrival_order() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    log: list = []
    await step(live, Flags(1, start=True), log, "start")
    # The first waits longest: without turns, the later ones would finish before it.
    await asyncio.gather(*(step(live, Flags(1), log, i, (5 - i) / 100) for i in range(5)))
    assert log == ["start", 0, 1, 2, 3, 4]


@synchronously
async def test_an_end_frees_the_sequence_and_a_start_makes_it_again() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    log: list = []
    await step(live, Flags(1, start=True), log, 1)
    await step(live, Flags(1, end=True), log, 2)
    assert len(live) == 0
    with pytest.raises(InvalidArgument, match="sequence 1 of model 'm' is not active"):
        await step(live, Flags(1), log, 3)
    async with live.turn(Flags(1, start=True), list) as entry:
        assert entry.value == []  # a fresh value


@synchronously
async def test_a_failed_request_leaves_the_sequence_but_a_failed_start_does_not() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    with pytest.raises(ValueError):
        async with live.turn(Flags(1, start=True), list):
            raise ValueError("bad input")
    assert len(live) == 0
    await step(live, Flags(2, start=True), [], 1)
    with pytest.raises(ValueError):
        async with live.turn(Flags(2, end=True), list):
            raise ValueError("bad input")
    async with live.turn(Flags(2), list) as entry:
        assert entry.value == [1]


@synchronously
async def test_sequences_of_two_scopes_never_meet() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    await step(live, Flags(1, start=True, scope="alice"), [], "alice's")
    with pytest.raises(InvalidArgument, match="not active"):
        await step(live, Flags(1, scope="mallory"), [], "mallory's")


@synchronously
async def test_past_the_limit_a_start_is_refused_until_one_idles_out() -> None:
    live: Live[list] = Live("pipeline 'p'", 0.05, 2)
    for sequence in (1, 2):
        await step(live, Flags(sequence, start=True), [], sequence)
    with pytest.raises(Overloaded, match="pipeline 'p' holds 2 sequences, its most") as refused:
        await step(live, Flags(3, start=True), [], 3)
    assert refused.value.retry_after == 0.05
    await asyncio.sleep(0.1)
    await step(live, Flags(3, start=True), [], 3)
    assert len(live) == 1
    with pytest.raises(InvalidArgument, match="idle longer than 50000 µs"):
        await step(live, Flags(1), [], 1)


@synchronously
async def test_an_unknown_sequence_may_go_on_where_its_keeper_allows() -> None:
    live: Live[str] = Live("pipeline 'p'", 10, 8)
    async with live.turn(Flags(9), str, unknown=True) as entry:
        entry.value = "arm"
    async with live.turn(Flags(9), str, unknown=True) as entry:
        assert entry.value == "arm"
