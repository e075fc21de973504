"""A big flight cut into parts for the replicas (upstream/split.py): parts of whole members
with about equal rows, as many as parts of the least bytes allow (up to PARTS_A_REPLICA a
replica), and their results stacked back as the whole call's would have been."""

from __future__ import annotations

import numpy as np

from services.gateway.upstream import split
from strata.proto.v1 import tensor_pb2 as v1

ROW = 100  # bytes a row


def flight(rows: list[int]) -> v1.ProcessRequest:
    total = sum(rows)
    data = np.arange(total * ROW, dtype=np.uint32).astype(np.uint8).tobytes()
    tensor = v1.Tensor(name="x", datatype="UINT8", shape=[total, ROW], data=data)
    item = v1.Request(id="f", pipeline="p", tensors=[tensor], parameters={"model_version": "2"})
    for number, count in enumerate(rows):
        item.members.add(id=f"m{number}", rows=count)
    return v1.ProcessRequest(requests=[item])


def answer(part: v1.ProcessRequest, failing: set[str] = frozenset()) -> v1.ProcessResponse:
    """What a layer answers: each member's rows doubled, the failing members left out."""
    item = part.requests[0]
    result = v1.Result(id=item.id)
    starts = np.cumsum([0] + [m.rows for m in item.members])
    rows = np.frombuffer(item.tensors[0].data, np.uint8).reshape(-1, ROW)
    kept = []
    for index, member in enumerate(item.members):
        if member.id in failing:
            result.members.add(id=member.id, error=v1.Error(code=3, message="bad"))
            continue
        result.members.add(id=member.id, rows=member.rows)
        kept.append(rows[starts[index] : starts[index + 1]])
    if kept:
        out = np.concatenate(kept) * 2
        result.tensors.add(name="y", datatype="UINT8", shape=out.shape, data=out.tobytes())
    result.info["seen"] = "yes"
    return v1.ProcessResponse(results=[result])


def test_parts_are_whole_members_of_about_equal_rows_in_order() -> None:
    request = flight([1, 1, 1, 1, 1, 1, 1, 1])
    pieces = split.parts(request, 2, min_bytes=2 * ROW)
    assert [[m.id for m in p.requests[0].members] for p in pieces] == [
        ["m0", "m1"],
        ["m2", "m3"],
        ["m4", "m5"],
        ["m6", "m7"],
    ]
    for piece in pieces:
        item = piece.requests[0]
        assert (item.id, item.pipeline, dict(item.parameters)) == ("f", "p", {"model_version": "2"})
        assert item.tensors[0].shape == [2, ROW]
    joined = b"".join(p.requests[0].tensors[0].data for p in pieces)
    assert joined == request.requests[0].tensors[0].data


def test_parts_are_as_small_as_the_least_bytes_allow_up_to_a_few_a_replica() -> None:
    members = [1] * 12
    assert len(split.parts(flight(members), 2, min_bytes=ROW)) == 2 * split.PARTS_A_REPLICA
    assert len(split.parts(flight(members), 3, min_bytes=ROW)) == 3 * split.PARTS_A_REPLICA
    assert len(split.parts(flight([1, 1, 1]), 2, min_bytes=ROW)) == 3  # a part a member
    assert len(split.parts(flight(members), 2, min_bytes=5 * ROW)) == 2  # 1,200 bytes


def test_uneven_members_still_leave_every_part_one() -> None:
    pieces = split.parts(flight([5, 1, 1]), 3, min_bytes=ROW)
    assert [len(p.requests[0].members) for p in pieces] == [1, 1, 1]
    pieces = split.parts(flight([1, 1, 6]), 2, min_bytes=4 * ROW)  # 2 parts
    assert [[m.rows for m in p.requests[0].members] for p in pieces] == [[1, 1], [6]]


def test_small_flights_and_single_requests_go_whole() -> None:
    assert split.parts(flight([1, 1, 1, 1]), 2, min_bytes=3 * ROW) == []  # 400 bytes: one part
    assert len(split.parts(flight([1, 1, 1, 1]), 4, min_bytes=2 * ROW)) == 2
    assert split.parts(flight([1, 1]), 1, min_bytes=1) == []  # one replica takes messages
    lone = flight([3])
    assert split.parts(lone, 2, min_bytes=1) == []
    del lone.requests[0].members[:]
    assert split.parts(lone, 2, min_bytes=1) == []


def test_merged_answers_equal_the_whole_calls_failures_included() -> None:
    request = flight([2, 1, 3, 1, 1])
    for failing in (set(), {"m1"}, {"m0", "m1"}, {"m3", "m4"}, {"m0", "m1", "m2", "m3", "m4"}):
        whole = answer(request, failing)
        pieces = split.parts(request, 2, min_bytes=3 * ROW)
        assert len(pieces) == 2
        merged = split.merge([answer(p, failing) for p in pieces])
        assert merged == whole, failing


def test_outputs_of_different_row_shapes_are_not_merged() -> None:
    pieces = split.parts(flight([1, 1]), 2, min_bytes=ROW)
    replies = [answer(p) for p in pieces]
    tensor = replies[1].results[0].tensors[0]
    tensor.shape[:] = [2, ROW // 2]  # as a tokenizer padding each call to its own longest row
    assert split.merge(replies) is None
