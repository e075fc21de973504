"""A big flight cut into parts for the replicas (upstream/split.py): parts of whole members
with about equal rows, as many as parts of the least bytes allow (up to PARTS_A_REPLICA a
replica), and their results stacked back as the whole call's would have been; a flight placed
in the gateway's slab cut by ref."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from services.gateway.upstream import split
from services.gateway.upstream.slabs import Passed, ProcessSlabs
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.slab import PAGE, Ref, Slab, Slabs

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


def test_a_flight_placed_in_the_slab_is_cut_by_ref_each_part_naming_its_members_bytes(
    tmp_path: Path,
) -> None:
    """Photos (BYTES, of unequal lengths) placed once for the whole flight: each part names
    its members' bytes in the block, at any offset, read back as the bytes cut would be."""
    photos = [bytes([i]) * (5000 + 997 * i) for i in range(4)]
    tensor = codec.to_tensor("image", np.array(photos, dtype=object))
    item = v1.Request(id="f", pipeline="p", tensors=[tensor])
    for number in range(4):
        item.members.add(id=f"m{number}", rows=1)
    request = v1.ProcessRequest(requests=[item])
    slab = Slab(tmp_path, "gateway", 64 * PAGE, 1, 30)
    hop = ProcessSlabs("preprocess", Passed(tmp_path), slab)
    hop.shares = True
    with hop.carrying(request):
        assert request.requests[0].tensors[0].slab  # placed whole, once
        pieces = split.parts(request, 2, min_bytes=PAGE, placed=hop.placed)
        assert len(pieces) == 4
        reader = Slabs(tmp_path)
        for photo, piece in zip(photos, pieces, strict=True):
            (part,) = piece.requests[0].tensors
            assert not part.data and list(part.shape) == [1]
            read = reader.read(Ref.parse(part.slab), "photo", release=False)
            assert codec.from_raw("image", "BYTES", [1], read)[0] == photo
    slab.close()
