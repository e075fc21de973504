"""Limits on the tensors a message declares, checked before anything is allocated.

A tensor's header (datatype and shape) costs a few bytes whatever it declares, so every
decode path checks the declaration here first, against the limits and the bytes actually
sent: a header that would take gigabytes is refused in microseconds, whatever its shape, with
INVALID_ARGUMENT naming the tensor and the limit. It is the one implementation every layer
uses: the codec calls it on every decode, strata.wire.stack before it cuts a stacked tensor by its
shape. A service installs the configured limits at start-up (`install`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.errors import InvalidArgument, shown

# Wire bytes per element of each v2 datatype; for BYTES, its 4-byte length prefix, the least
# an element can take.
WIDTHS = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "FP32": 4,
    "FP64": 8,
    "BYTES": 4,
}
_SHOWN_DIMS = 8  # dimensions a message quotes before it elides the rest


@dataclass(frozen=True)
class Limits:
    """What one tensor may declare: the config's `limits` (strata.config.limits) as plain values."""

    max_rank: int = 8
    max_dimension: int = 1 << 24
    max_elements: int = 1 << 26
    max_bytes: int = 1 << 26
    max_strings: int = 1 << 16


_installed = Limits()


def install(limits: Limits) -> None:
    """Make `limits` the ones every check in this process applies (done at service start)."""
    global _installed
    _installed = limits


def installed() -> Limits:
    return _installed


def check_declared(
    name: str,
    datatype: str,
    shape: Sequence[int],
    sent_bytes: int | None,
    limits: Limits | None = None,
) -> int:
    """The element count of a declared tensor, once it is within `limits` (the installed
    ones by default) and `sent_bytes` can hold it; None for typed contents, whose values the
    caller counts. InvalidArgument names the tensor and the limit otherwise."""
    limits = _installed if limits is None else limits
    width = WIDTHS.get(datatype)
    if width is None:
        raise InvalidArgument(
            f"input {shown(name)}: unknown datatype {shown(datatype)} (known: {', '.join(WIDTHS)})"
        )
    count = _count(name, shape, limits)
    if datatype == "BYTES":
        _check_strings(name, shape, count, sent_bytes, limits)
    else:
        _check_fixed(name, datatype, shape, count * width, sent_bytes, limits)
    return count


def _count(name: str, shape: Sequence[int], limits: Limits) -> int:
    """The elements `shape` holds; the limit applies to those it spans with its 0 dimensions
    counted as 1 (numpy refuses a shape whose other dimensions could not fit in memory, even
    when it holds no element)."""
    if len(shape) > limits.max_rank:
        raise InvalidArgument(
            f"input {shown(name)}: shape {_shown(shape)} has rank {len(shape)}, more than the "
            f"limit of {limits.max_rank} (limits.max_rank)"
        )
    count = cells = 1
    for size in shape:
        if not 0 <= size <= limits.max_dimension:
            raise _dimensionInvalidArgument(name, shape, limits.max_dimension)
        count *= size
        cells *= size or 1
    if cells > limits.max_elements:
        raise InvalidArgument(
            f"input {shown(name)}: shape {_shown(shape)} spans {cells} elements, more than the "
            f"limit of {limits.max_elements} (limits.max_elements)"
        )
    return count


def _dimensionInvalidArgument(name: str, shape: Sequence[int], largest: int) -> InvalidArgument:
    axis, size = next((a, d) for a, d in enumerate(shape) if not 0 <= d <= largest)
    if size < 0:
        return InvalidArgument(
            f"input {shown(name)}: shape {_shown(shape)} has a negative dimension"
        )
    return InvalidArgument(
        f"input {shown(name)}: dimension {axis} is {size}, more than the limit of {largest} "
        "(limits.max_dimension)"
    )


def _check_fixed(
    name: str,
    datatype: str,
    shape: Sequence[int],
    needed: int,
    sent: int | None,
    limits: Limits,
) -> None:
    if needed > limits.max_bytes:
        raise InvalidArgument(
            f"input {shown(name)}: shape {_shown(shape)} of {datatype} takes {needed} bytes, more "
            f"than the limit of {limits.max_bytes} (limits.max_bytes)"
        )
    if sent is not None and sent != needed:
        raise InvalidArgument(
            f"input {shown(name)}: shape {_shown(shape)} of {datatype} needs {needed} bytes, "
            f"got {sent}"
        )


def _check_strings(
    name: str, shape: Sequence[int], count: int, sent: int | None, limits: Limits
) -> None:
    if count > limits.max_strings:
        raise InvalidArgument(
            f"input {shown(name)}: BYTES shape {_shown(shape)} holds {count} elements, more than "
            f"the limit of {limits.max_strings} (limits.max_strings)"
        )
    if sent is None:
        return
    if sent > limits.max_bytes:
        raise InvalidArgument(
            f"input {shown(name)}: {sent} bytes of BYTES data, more than the limit of "
            f"{limits.max_bytes} (limits.max_bytes)"
        )
    least = count * WIDTHS["BYTES"]
    if least > sent:
        raise InvalidArgument(
            f"input {shown(name)}: BYTES shape {_shown(shape)} needs at least {least} bytes "
            f"(a 4-byte length per element), got {sent}"
        )


def _shown(shape: Sequence[int]) -> str:
    """A shape as a message quotes it: a declared rank can be long."""
    if len(shape) <= _SHOWN_DIMS:
        return str(list(shape))
    head = ", ".join(str(d) for d in shape[:_SHOWN_DIMS])
    return f"[{head}, ... {len(shape) - _SHOWN_DIMS} more]"
