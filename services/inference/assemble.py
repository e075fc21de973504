"""Many requests into one batch and the batch's outputs back into one answer per request.

Inputs stack along the first (batch) dimension. An input named in the model's `padding` has
its open dimensions padded, with the configured value, to the longest in the batch; a mask
input listed there with 0 is padded the same way, so padded positions stay masked. An output
dimension that shares its symbolic name with a padded input dimension is cut back to each
request's own length, so a request's answer has the shape it would have had alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from services.inference.signature import Signature
from strata.wire.codec import Arrays


@dataclass(frozen=True)
class Slot:
    """Where one request sits in a batch: its rows and its length on each padded dim."""

    start: int
    rows: int
    lengths: dict[str, int]


def merge(signature: Signature, requests: Sequence[Arrays]) -> tuple[Arrays, list[Slot]]:
    """One batch from requests whose batching keys are equal."""
    slots, start = [], 0
    for request in requests:
        rows = len(next(iter(request.values())))
        slots.append(Slot(start, rows, _lengths(signature, request)))
        start += rows
    batch = {
        info.name: _stack([r[info.name] for r in requests], signature.padded.get(info.name), start)
        for info in signature.inputs
    }
    return batch, slots


def split(signature: Signature, outputs: Arrays, slots: Sequence[Slot]) -> list[Arrays]:
    """Each request's outputs: its rows, padded dimensions cut back to its own lengths."""
    total = slots[-1].start + slots[-1].rows
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(
                f"output {name!r} has shape {list(array.shape)} for a batch of {total} rows"
            )
    dims = {info.name: info.dims for info in signature.outputs}
    answers = []
    for slot in slots:
        answer = {}
        for name, array in outputs.items():
            index = [slice(slot.start, slot.start + slot.rows)]
            for dim in dims.get(name, ())[1:]:
                index.append(slice(0, slot.lengths[dim]) if dim in slot.lengths else slice(None))
            answer[name] = array[tuple(index)]
        answers.append(answer)
    return answers


def _lengths(signature: Signature, request: Arrays) -> dict[str, int]:
    lengths = {}
    for info in signature.inputs:
        if info.name not in signature.padded:
            continue
        for axis, dim in enumerate(info.dims[1:], start=1):
            if dim is not None and info.shape[axis] == -1:
                lengths[dim] = request[info.name].shape[axis]
    return lengths


def _stack(arrays: list[np.ndarray], pad: float | None, rows: int) -> np.ndarray:
    if len(arrays) == 1:
        return arrays[0]
    shapes = {a.shape[1:] for a in arrays}
    if len(shapes) == 1:
        return np.concatenate(arrays, axis=0)
    if pad is None:
        raise ValueError(f"requests of shapes {sorted(shapes)} cannot share a batch unpadded")
    longest = tuple(max(sizes) for sizes in zip(*shapes, strict=True))
    fill = "" if arrays[0].dtype == object else pad  # string inputs hold str (Signature.strings)
    out = np.full((rows, *longest), fill, dtype=arrays[0].dtype)
    start = 0
    for array in arrays:
        index = (slice(start, start + len(array)), *(slice(0, d) for d in array.shape[1:]))
        out[index] = array
        start += len(array)
    return out
