"""Checks a request's tensors against a pipeline's declared inputs.

The gateway runs this before any upstream call, and preprocess runs it as its first step, so a
bad request is refused with a message naming the input and the rule it broke.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from strata.config.pipelines import InputSpec, TensorSpec
from strata.errors import InvalidArgument, shown
from strata.wire.codec import datatype_of, utf8


def validate_inputs(
    arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec], max_batch_size: int
) -> int:
    """Raise InvalidArgument unless `arrays` match `specs`; return the batch size (1 where
    `max_batch_size` is 0: the inputs have no batch dimension)."""
    # Names are unique on each side (the config checks the specs'): equal counts, each spec's
    # name present, means the same names, and a request pays for no sets.
    if len(arrays) != len(specs) or not all(spec.name in arrays for spec in specs):
        _refuse_names(arrays, specs)
    for spec in specs:
        check_tensor(spec, arrays[spec.name])
    if max_batch_size == 0:
        return 1  # no batch dimension: the request is one whole input
    batches: set[int] = {arrays[spec.name].shape[0] for spec in specs}
    if len(batches) > 1:
        raise InvalidArgument(f"inputs disagree on the batch size: {sorted(batches)}")
    batch = batches.pop()
    if batch > max_batch_size:
        raise InvalidArgument(
            f"batch of {batch} exceeds the pipeline's limit of {max_batch_size} "
            "(its max_batch_size)"
        )
    return batch


def _refuse_names(arrays: Mapping[str, np.ndarray], specs: Sequence[TensorSpec]) -> None:
    names = {spec.name for spec in specs}
    unknown = sorted(set(arrays) - names)
    if unknown:
        raise InvalidArgument(
            f"unknown input {shown(unknown[0])}; expected inputs: {sorted(names)}"
        )
    missing = sorted(names - set(arrays))
    raise InvalidArgument(f"missing input {missing[0]!r}; expected inputs: {sorted(names)}")


def check_datatype(spec: TensorSpec, datatype: str) -> None:
    """The datatype a request declares for an input against the pipeline's."""
    if datatype != spec.datatype:
        raise InvalidArgument(f"input {spec.name!r}: datatype {datatype}, expected {spec.datatype}")


def check_tensor(spec: InputSpec, array: np.ndarray) -> None:
    """Datatype, rank, each dimension, and the values themselves where the spec asks."""
    check_datatype(spec, datatype_of(array))
    if array.ndim != len(spec.shape):
        raise InvalidArgument(
            f"input {spec.name!r}: shape {list(array.shape)} has rank {array.ndim}, "
            f"expected rank {len(spec.shape)} like {spec.shape}"
        )
    for axis, size in enumerate(array.shape):
        declared = spec.shape[axis]
        if declared != -1 and size != declared:
            raise InvalidArgument(
                f"input {spec.name!r}: dimension {axis} is {size}, expected {declared}"
            )
        least = 0 if spec.allow_empty and declared == -1 else 1
        if size < least or size > spec.limit(axis):
            raise InvalidArgument(
                f"input {spec.name!r}: dimension {axis} is {size}, "
                f"allowed {least}..{spec.limit(axis)}"
                + (" (its max_shape)" if spec.max_shape else "")
            )
    if array.dtype.kind == "f" and not spec.allow_nonfinite and not np.isfinite(array).all():
        raise InvalidArgument(f"input {spec.name!r}: contains NaN or infinite values")
    if spec.range is not None and array.size:
        _check_range(spec.name, spec.range, array)
    if array.dtype == object:
        _check_elements(spec, array)
    elif spec.utf8:
        _check_utf8(spec.name, array)


def _check_range(name: str, bounds: tuple[float, float], array: np.ndarray) -> None:
    low, high = bounds
    outside = ~((array >= low) & (array <= high))  # NaN is outside too
    if outside.any():
        at = tuple(int(i) for i in np.argwhere(outside)[0])
        raise InvalidArgument(
            f"input {name!r}: value {array[at].item():.6g} at {list(at)} is outside its "
            f"declared range [{low:g}, {high:g}]"
        )


def _check_elements(spec: InputSpec, array: np.ndarray) -> None:
    """Each BYTES element's size, and its UTF-8 where the spec asks: one pass over them."""
    limit, text, what = spec.max_element_bytes, spec.utf8, f"input {spec.name!r}"
    for index, item in enumerate(array.reshape(-1)):
        if len(item) > limit:
            raise InvalidArgument(
                f"input {spec.name!r}: element {index} has {len(item)} bytes, "
                f"more than the limit of {spec.max_element_bytes} (the input's max_element_bytes "
                "in the pipeline's config)"
            )
        if text:
            utf8(item, what, index)


def _check_utf8(name: str, array: np.ndarray) -> None:
    for index, item in enumerate(array.reshape(-1)):
        utf8(item, f"input {name!r}", index)
