"""strata.v1 flights for layer tests: members' tensors stacked into one Request, and each
member's answer read back out of the Result."""

from __future__ import annotations

import numpy as np

from strata.errors import StrataError, from_code
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.codec import Arrays, tensors_to_arrays


def flight(pipeline: str, members: dict[str, Arrays], **parameters: str) -> v1.Request:
    """A flight of `members` (id -> its tensors, all of the same names), stacked in order."""
    first = next(iter(members.values()))
    stacked = {name: np.concatenate([m[name] for m in members.values()]) for name in first}
    item = v1.Request(
        id="flight",
        pipeline=pipeline,
        tensors=codec.arrays_to_tensors(stacked),
        parameters=parameters,
    )
    for rid, arrays in members.items():
        item.members.add(id=rid, rows=len(next(iter(arrays.values()))))
    return item


def alone(pipeline: str, members: dict[str, Arrays], **parameters: str) -> list[v1.Request]:
    """The same members as plain requests, one each."""
    return [
        v1.Request(
            id=rid,
            pipeline=pipeline,
            tensors=codec.arrays_to_tensors(arrays),
            parameters=parameters,
        )
        for rid, arrays in members.items()
    ]


def by_member(result: v1.Result) -> dict[str, Arrays | StrataError]:
    """Each member's outputs (its rows), or its error, by id."""
    return {m.id: outcome for m, outcome in zip(result.members, split_flight(result), strict=True)}


def split_flight(result: v1.Result) -> list[Arrays | StrataError]:
    """A flight result per member, in order: its rows of the stacked tensors (views), or
    its mapped domain error."""
    stack = tensors_to_arrays(result.tensors)
    out: list[Arrays | StrataError] = []
    start = 0
    for member in result.members:
        if member.HasField("error"):
            out.append(from_code(member.error.code, member.error.message))
            continue
        stop = start + member.rows
        out.append({name: array[start:stop] for name, array in stack.items()})
        start = stop
    return out
