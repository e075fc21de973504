"""Tensors of a flight: many requests' rows stacked along the first dimension, as raw bytes.

The gateway forwards what a layer returned to the next layer without decoding it; these
helpers join the requests' raw tensors into one stack and cut members out of a stack by
slicing bytes (fixed-size datatypes) or, for BYTES, by walking the length prefixes. A stack
is cut only once its declared shape passes the same check as every decode (strata.wire.limits).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from strata.errors import InvalidArgument
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.limits import WIDTHS, check_declared
from strata.wire.slab import Ref

_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class Raw:
    """One request's tensor as it came off the wire; or, where `ref` names the slab block
    that holds it, its bytes in place there (`data` a view)."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes | memoryview
    ref: Ref | None = None


def size(datatype: str, shape: Sequence[int], data: Callable[[], bytes]) -> int:
    """A tensor's bytes, from its shape where its datatype has a fixed width, else the
    length of its `data` (read only then): each read of a protobuf message's bytes field
    copies them (22 us for a photo's 602 KB of features), and the gateway sizes every
    message of a flight. For sizing and timing; the data is checked against its shape where
    it is decoded or cut."""
    width = WIDTHS.get(datatype)
    if width is None or datatype == "BYTES":
        return len(data())
    return width * math.prod(shape)


def tensor_size(tensor: v1.Tensor) -> int:
    """A strata.v1 tensor's bytes, without copying its data where its shape says (`size`)."""
    return size(tensor.datatype, tensor.shape, lambda: tensor.data)


def signature(tensors: Sequence[Raw]) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    """What requests must share to be stacked: each tensor's name, datatype and row shape."""
    return tuple((t.name, t.datatype, t.shape[1:]) for t in tensors)


def join(
    members: Sequence[Sequence[Raw]], into: RepeatedCompositeFieldContainer[v1.Tensor]
) -> None:
    """One tensor per name added to a message's tensors (`into`), the members' rows in order
    (members share a `signature`): made in place, as a tensor made apart is copied again."""
    first = members[0]
    for i, tensor in enumerate(first):
        if len(members) == 1:
            into.add(
                name=tensor.name, datatype=tensor.datatype, shape=tensor.shape, data=tensor.data
            )
            continue
        into.add(
            name=tensor.name,
            datatype=tensor.datatype,
            shape=(sum(member[i].shape[0] for member in members), *tensor.shape[1:]),
            data=b"".join(member[i].data for member in members),
        )


def take(tensors: Sequence[v1.Tensor], rows: Sequence[int], keep: Sequence[int]) -> list[v1.Tensor]:
    """The rows of members `keep` (indices into `rows`, ascending) out of stacked `tensors`."""
    starts = [0, *accumulate(rows)]
    total = starts[-1]
    kept = sum(rows[i] for i in keep)
    out = []
    for tensor in map(raw, tensors):
        bounds = _row_bounds(tensor, total)
        data = b"".join(tensor.data[bounds[starts[i]] : bounds[starts[i + 1]]] for i in keep)
        shape = (kept, *tensor.shape[1:])
        out.append(v1.Tensor(name=tensor.name, datatype=tensor.datatype, shape=shape, data=data))
    return out


def cut(
    tensors: Sequence[Raw], rows: Sequence[int], runs: Sequence[range], into: Sequence[v1.Request]
) -> None:
    """Stacked `tensors` cut into runs of consecutive members (`runs`: indices into `rows`),
    each run's rows, one slice of each tensor's bytes (or the part of its block that holds
    them, for a tensor in a slab), added to its request of `into`."""
    starts = [0, *accumulate(rows)]
    total = starts[-1]
    for tensor in tensors:
        bounds = _row_bounds(tensor, total)
        for request, run in zip(into, runs, strict=True):
            first, last = starts[run.start], starts[run.stop]
            # Added in place: a message made apart is copied again when added.
            part = request.tensors.add(
                name=tensor.name, datatype=tensor.datatype, shape=(last - first, *tensor.shape[1:])
            )
            start, stop = bounds[first], bounds[last]
            if tensor.ref is not None and stop > start:
                part.slab = tensor.ref.part(start, stop).text()
            else:
                part.data = bytes(tensor.data[start:stop])


def raw(tensor: v1.Tensor) -> Raw:
    """A strata.v1 tensor with its bytes read out once: each read of a protobuf message's
    bytes field copies them, and a stack of photos is megabytes."""
    _holds_bytes(tensor)
    return Raw(tensor.name, tensor.datatype, tuple(tensor.shape), tensor.data)


def _holds_bytes(tensor: v1.Tensor) -> None:
    """ValueError for a tensor that names slab blocks: their bytes must be read first (a
    bug of the caller's, never the client's)."""
    if tensor.slab:
        raise ValueError(f"tensor {tensor.name!r} names slab blocks: read its bytes first")


def _check_stacked(tensor: Raw, total: int) -> None:
    """ValueError unless `tensor` is a well-formed stack over `total` rows: what is cut here
    was decoded (and checked) once already or is a layer's answer, so a malformed stack is a
    bug, not the client's mistake."""
    try:
        check_declared(tensor.name, tensor.datatype, tensor.shape, len(tensor.data))
    except InvalidArgument as exc:
        raise ValueError(f"malformed tensor in a stack: {exc}") from None
    if not tensor.shape or tensor.shape[0] != total:
        raise ValueError(
            f"tensor {tensor.name!r} of shape {list(tensor.shape)} is not stacked over {total} rows"
        )


def _row_bounds(tensor: Raw, total: int) -> list[int]:
    """Byte offset of the start of each row, and of the end, of a checked stack."""
    _check_stacked(tensor, total)
    if total == 0:
        return [0]
    per_row = 1
    for dim in tensor.shape[1:]:
        per_row *= dim
    if tensor.datatype != "BYTES":
        size = len(tensor.data) // total
        return [row * size for row in range(total + 1)]
    bounds, offset, data = [0], 0, tensor.data
    for _ in range(total):
        for _ in range(per_row):
            if offset + 4 > len(data):
                raise ValueError(f"tensor {tensor.name!r}: BYTES data ends early")
            offset += 4 + _LENGTH.unpack_from(data, offset)[0]
        bounds.append(offset)
    return bounds
