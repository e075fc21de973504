"""Golden cases: a version serves only if it reproduces them, alone and batched together.

`<version>/validation/*.npz` files hold arrays `input.<name>` and `output.<name>` and scalars
`atol` and `rtol`. Each case runs alone, then the cases that can share a batch run as one
batch (padded where the model pads), so a model whose answers change when batched is refused
before it serves. The failing case is named in the error.
"""

from __future__ import annotations

import time
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.inference.signature import Signature
from strata.errors import NotReady, StrataError
from strata.wire.codec import DTYPES, Arrays

Runner = Callable[[Sequence[Arrays]], list[Arrays]]


@dataclass
class Case:
    """A golden case: inputs, the outputs they must give, and the tolerance."""

    name: str
    inputs: Arrays
    outputs: Arrays
    atol: float
    rtol: float


def read_cases(folder: Path) -> list[Case]:
    """Every case in `folder` (none if it does not exist), by file name."""
    return [_read_case(path) for path in sorted(folder.glob("*.npz"))]


def _read_case(path: Path) -> Case:
    try:
        with np.load(path, allow_pickle=False) as data:
            inputs = _prefixed(data, "input.")
            outputs = _prefixed(data, "output.")
            atol, rtol = float(data["atol"]), float(data["rtol"])
    except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
        raise NotReady(f"validation case {path.stem!r} cannot be read: {exc}") from None
    if not inputs or not outputs:
        raise NotReady(f"validation case {path.stem!r} needs input.* and output.* arrays")
    return Case(path.stem, inputs, outputs, atol, rtol)


def _prefixed(data: np.lib.npyio.NpzFile, prefix: str) -> Arrays:
    return {key[len(prefix) :]: data[key] for key in data.files if key.startswith(prefix)}


def validate(signature: Signature, run: Runner, cases: Sequence[Case]) -> None:
    """Raise NotReady naming the first case the model does not reproduce."""
    keys = {}
    for case in cases:
        try:
            keys[case.name] = signature.check(case.inputs)
            case.inputs = signature.strings(case.inputs)
            (got,) = run([case.inputs])
        except StrataError as exc:
            raise NotReady(f"validation case {case.name!r} does not run: {exc}") from None
        _compare(case, got, "")
    if signature.batchable:
        for group in _groups(signature, cases, keys):
            _validate_batch(run, group)


def _validate_batch(run: Runner, group: list[Case]) -> None:
    names = [case.name for case in group]
    try:
        answers = run([case.inputs for case in group])
    except StrataError as exc:
        raise NotReady(f"validation cases {names} fail when batched together: {exc}") from None
    for case, got in zip(group, answers, strict=True):
        others = [name for name in names if name != case.name]
        _compare(case, got, f" when batched with {others}")


def _groups(
    signature: Signature, cases: Sequence[Case], keys: dict[str, tuple[int, object]]
) -> list[list[Case]]:
    """Cases that can share a batch, split so that no batch exceeds the max batch size."""
    groups: dict[object, list[list[Case]]] = {}
    for case in cases:
        rows, key = keys[case.name]
        batches = groups.setdefault(key, [[]])
        if sum(keys[c.name][0] for c in batches[-1]) + rows > signature.max_batch_size:
            batches.append([])
        batches[-1].append(case)
    return [group for batches in groups.values() for group in batches if len(group) > 1]


def _compare(case: Case, got: Arrays, how: str) -> None:
    for name, expected in case.outputs.items():
        if name not in got:
            raise NotReady(f"validation case {case.name!r}: the model has no output {name!r}")
        actual = got[name]
        if actual.shape != expected.shape:
            raise NotReady(
                f"validation case {case.name!r} output {name!r}{how}: shape "
                f"{list(actual.shape)}, expected {list(expected.shape)}"
            )
        if expected.dtype == object or actual.dtype == object:
            if not np.array_equal(actual, expected):
                raise NotReady(f"validation case {case.name!r} output {name!r}{how} differs")
        elif not np.allclose(actual, expected, atol=case.atol, rtol=case.rtol):
            worst = float(np.max(np.abs(actual.astype(float) - expected.astype(float))))
            raise NotReady(
                f"validation case {case.name!r} output {name!r}{how} differs by {worst:.3g} "
                f"(atol {case.atol:g}, rtol {case.rtol:g})"
            )


def warm(signature: Signature, run: Runner, cases: Sequence[Case]) -> list[tuple[int, float]]:
    """Run one row and a full batch (twice each, timing the second); (rows, seconds) pairs."""
    sample = cases[0].inputs if cases else _zeros(signature)
    sizes = sorted({1, signature.max_batch_size}) if signature.batchable else [0]
    timings = []
    for rows in sizes:
        batch = _tile(sample, rows) if rows else sample
        try:
            run([batch])
            start = time.perf_counter()
            run([batch])
        except StrataError as exc:
            raise NotReady(f"warm-up with {max(rows, 1)} rows failed: {exc}") from None
        timings.append((max(rows, 1), time.perf_counter() - start))
    return timings


def _tile(arrays: Arrays, rows: int) -> Arrays:
    return {
        name: np.take(array, np.arange(rows) % len(array), axis=0) for name, array in arrays.items()
    }


def _zeros(signature: Signature) -> Arrays:
    """An input of zeros for each of the model's: the string "0" for a string input, which
    a model that parses its strings as numbers (a Cast) reads too."""
    return {
        info.name: np.full(
            [max(d, 1) for d in info.shape],
            "0" if info.datatype == "BYTES" else 0,
            dtype=DTYPES[info.datatype],
        )
        for info in signature.inputs
    }
