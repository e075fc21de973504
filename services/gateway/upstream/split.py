"""A big flight's call cut into one part per replica, and the parts' answers made one again.

A flight's strata.v1 call goes whole to one replica (upstream/lanes.py's Spread). Where a
layer has several replicas and the flight carries heavy rows (photos), that replica works
through all of them while the others idle: with two preprocess replicas and the gateway's two
flights in the air, a flight of 15 photos on one replica and a flight of one on the other is
the common case under a closed loop. So a flight of at least `min_bytes` of tensors a part is
cut, by its members, into as many parts as replicas take messages, each with about the same
rows; the parts go out at once (Spread gives each to the replica owing the fewest rows), and
their results are stacked back in member order, as the whole call's would have been.

A layer's outputs can only be stacked again where every part's have one row shape (a
tokenizer pads each call to its own longest row): where they differ, the flight is sent again
whole and its pipeline is not cut again.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import accumulate

from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import stack


def parts(request: v1.ProcessRequest, count: int, min_bytes: int) -> list[v1.ProcessRequest]:
    """`request` cut into at most `count` parts of whole members, of about equal rows and at
    least `min_bytes` each; [] where it is not worth cutting (one request, not a flight of
    several members, or too few bytes)."""
    if count < 2 or len(request.requests) != 1:
        return []
    item = request.requests[0]
    members = list(item.members)
    size = sum(stack.tensor_size(t) for t in item.tensors)
    count = min(count, len(members), size // max(min_bytes, 1))
    if count < 2:
        return []
    rows = [member.rows for member in members]
    return [_part(item, rows, group) for group in _groups(rows, count)]


def _groups(rows: Sequence[int], count: int) -> list[range]:
    """`count` runs of consecutive members, none empty, cut where the rows so far are
    nearest each part's even share."""
    ends = list(accumulate(rows))
    total = ends[-1]
    cuts, start = [], 0
    for part in range(1, count):
        share = total * part / count
        # The first member whose running rows reach the share, leaving one for each part after.
        stop = next(i + 1 for i in range(start, len(rows)) if ends[i] >= share)
        stop = max(start + 1, min(stop, len(rows) - (count - part)))
        cuts.append(range(start, stop))
        start = stop
    cuts.append(range(start, len(rows)))
    return cuts


def _part(item: v1.Request, rows: Sequence[int], group: range) -> v1.ProcessRequest:
    part = v1.Request(
        id=item.id,
        pipeline=item.pipeline,
        tensors=stack.take(item.tensors, rows, group),
        parameters=item.parameters,
        trace_context=item.trace_context,
        members=item.members[group.start : group.stop],
    )
    return v1.ProcessRequest(requests=[part])


def merge(replies: Sequence[v1.ProcessResponse]) -> v1.ProcessResponse | None:
    """The parts' replies (in order) as the whole call's; None where their outputs cannot
    be stacked (row shapes or names differ)."""
    results = [reply.results[0] for reply in replies if len(reply.results) == 1]
    if len(results) != len(replies):
        return None
    merged = v1.Result(id=results[0].id)
    for result in results:
        merged.members.extend(result.members)
        merged.info.update(result.info)
    answered = [list(r.tensors) for r in results if any(m.rows > 0 for m in r.members)]
    if answered:
        tensors = _stacked(answered)
        if tensors is None:
            return None
        merged.tensors.extend(tensors)
    return v1.ProcessResponse(results=[merged])


def _stacked(parts: Sequence[Sequence[v1.Tensor]]) -> list[v1.Tensor] | None:
    first = parts[0]
    shape = [(t.name, t.datatype, tuple(t.shape[1:])) for t in first]
    if any([(t.name, t.datatype, tuple(t.shape[1:])) for t in part] != shape for part in parts):
        return None
    return [
        v1.Tensor(
            name=tensor.name,
            datatype=tensor.datatype,
            shape=(sum(part[i].shape[0] for part in parts), *tensor.shape[1:]),
            data=b"".join(part[i].data for part in parts),
        )
        for i, tensor in enumerate(first)
    ]
