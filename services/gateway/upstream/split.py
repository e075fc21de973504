"""A big flight's call cut into parts for a layer's replicas, and the parts' answers made one
again.

A flight's strata.v1 call goes whole to one replica (upstream/lanes.py's Spread). Where a
layer has several replicas and the flight carries heavy rows (photos), that replica works
through all of them while the others idle: with two preprocess replicas and the gateway's two
flights in the air, a flight of 15 photos on one replica and a flight of one on the other is
the common case under a closed loop. So a flight of at least `min_bytes` of tensors a part is
cut, by its members, into parts of about the same rows: as many as parts of `min_bytes` allow,
up to PARTS_A_REPLICA for each replica that takes messages. Spread sends each replica a few at
a time and the rest to whichever answers first, so a replica that runs faster (the other
shares its core with the gateway) takes more parts instead of idling while the slower one
works through an even half: with one part a replica, the first half of a flight of 1280x960
photos landed tens of ms before the second. Their results are stacked back in member order,
as the whole call's would have been.

A flight whose photos the hop places in the gateway's slab (upstream/slabs.py) is placed once,
whole, and cut by ref: each part names the bytes of its own members within that block, so
that cutting copies nothing (it copied each photo three times, and placing each part twice).

A layer's outputs can only be stacked again where every part's have one row shape (a
tokenizer pads each call to its own longest row): where they differ, the flight is sent again
whole and its pipeline is not cut again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate

from services.gateway.upstream.slabs import Passed
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import stack
from strata.wire.slab import REFS

# Parts a flight is cut into for each replica, at most: enough that a faster replica takes a
# part more than the other, few enough that the messages cost little beside a part's work
# (with 4, a part a 1280x960 photo, the gateway spent about 1 ms more an image than with one
# part a replica, in one pair on a loaded machine; with 2 about the same).
PARTS_A_REPLICA = 2


def parts(
    request: v1.ProcessRequest,
    replicas: int,
    min_bytes: int,
    placed: Callable[[v1.Tensor], stack.Raw | None] = lambda tensor: None,
) -> list[v1.ProcessRequest]:
    """`request` cut, for `replicas` that take messages, into parts of whole members, of about
    equal rows and at least `min_bytes` each, at most PARTS_A_REPLICA a replica; [] where it
    is not worth cutting (one replica, one request, not a flight of several members, or too
    few bytes). A tensor this process placed in its slab (`placed`: it in place there, else
    None) is cut by ref: each part names its part of the block, no bytes copied."""
    if replicas < 2 or len(request.requests) != 1:
        return []
    item = request.requests[0]
    rows = [member.rows for member in item.members]
    tensors = [placed(t) or stack.raw(t) for t in item.tensors]
    size = sum(len(t.data) for t in tensors)
    count = min(replicas * PARTS_A_REPLICA, len(rows), size // max(min_bytes, 1))
    if count < 2:
        return []
    runs = _groups(rows, count)
    pieces = [_piece(item, run) for run in runs]
    stack.cut(tensors, rows, runs, [piece.requests[0] for piece in pieces])
    return pieces


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


def _piece(item: v1.Request, run: range) -> v1.ProcessRequest:
    """A part's call without its tensors (stack.cut adds them in place)."""
    piece = v1.ProcessRequest()
    part = piece.requests.add(id=item.id, pipeline=item.pipeline)
    part.parameters.update(item.parameters)
    part.trace_context.update(item.trace_context)
    part.members.extend(item.members[run.start : run.stop])
    return piece


def merge(
    replies: Sequence[v1.ProcessResponse], passed: Passed | None = None
) -> v1.ProcessResponse | None:
    """The parts' replies (in order) as the whole call's; None where their outputs cannot
    be stacked (row shapes or names differ). A tensor whose parts all name blocks of a slab
    names them all; one whose parts mix blocks and bytes is read into bytes (`passed`)."""
    results = [reply.results[0] for reply in replies if len(reply.results) == 1]
    if len(results) != len(replies):
        return None
    answered = [r.tensors for r in results if any(m.rows > 0 for m in r.members)]
    if not _stackable(answered):
        return None
    whole = v1.ProcessResponse()
    merged = whole.results.add(id=results[0].id)
    for result in results:
        merged.members.extend(result.members)
        merged.info.update(result.info)
    if answered:
        for i, tensor in enumerate(answered[0]):
            pieces = [part[i] for part in answered]
            stacked = merged.tensors.add(
                name=tensor.name,
                datatype=tensor.datatype,
                shape=(sum(piece.shape[0] for piece in pieces), *tensor.shape[1:]),
            )
            if all(piece.slab for piece in pieces):
                stacked.slab = REFS.join(piece.slab for piece in pieces)
                continue
            if passed is not None and any(piece.slab for piece in pieces):
                pieces, named = passed.read(pieces), pieces
                passed.release(named)  # read out: nothing else will name them
            stacked.data = b"".join(piece.data for piece in pieces)
    return whole


def _stackable(parts: Sequence[Sequence[v1.Tensor]]) -> bool:
    """Whether the parts' outputs share their names, datatypes and row shapes."""
    shapes = [[(t.name, t.datatype, tuple(t.shape[1:])) for t in part] for part in parts]
    return all(shape == shapes[0] for shape in shapes)
