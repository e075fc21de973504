"""A flight's tensors as one table of rows, for its later stages (model_stages.py).

The flight's tensors (preprocess's outputs and the first model's) make one table of rows,
kept as the raw bytes they came in: a stage that runs for every row sends them on as they
are, and one that answers every row puts its reply's bytes in the table as they came. A
tensor is decoded only where a condition reads it or a stage takes or writes some of its
rows, and encoded again only if a stage wrote into it. A conditional stage's rows are those
its condition picks, evaluated over the whole flight at once.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
from numpy.typing import NDArray

from services.gateway.flow.flights import Member
from strata.config.pipelines import Condition, Stage
from strata.errors import NotReady
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.limits import check_declared


@dataclass
class Table:
    """The flight's tensors stacked over every member's rows in boarding order: as raw
    bytes (`wire`) until a stage writes into them, and decoded (`arrays`) where a stage read
    or wrote them."""

    members: list[Member]
    wire: dict[str, v1.Tensor]
    given: list[str]
    answered: dict[Member, list[str]]
    degraded: dict[Member, str] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = [m.rows for m in self.members]
        self.starts: NDArray[np.intp] = np.array([0, *accumulate(self.rows)])
        self.total = int(self.starts[-1])

    @functools.cached_property
    def owner(self) -> NDArray[np.intp]:
        """Each row's member (its index)."""
        return np.repeat(np.arange(len(self.rows)), self.rows)

    def kind(self, name: str) -> tuple[str, list[int]] | None:
        """Tensor `name`'s datatype and the shape of its rows; None where there is none."""
        tensor = self.wire.get(name)
        if tensor is not None:
            return tensor.datatype, list(tensor.shape[1:])
        array = self.arrays.get(name)
        if array is None:
            return None
        return codec.datatype_of(array), list(array.shape[1:])

    def array(self, name: str) -> np.ndarray:
        """Tensor `name` decoded (a read-only view of the wire's bytes until written)."""
        array = self.arrays.get(name)
        if array is None:
            array = self.arrays[name] = codec.from_tensor(self.wire[name])
        return array

    def tensor(self, name: str) -> v1.Tensor:
        """Tensor `name` as strata.v1 bytes: as it came where no stage wrote into it."""
        tensor = self.wire.get(name)
        return tensor if tensor is not None else codec.to_tensor(name, self.arrays[name])

    def put(self, tensor: v1.Tensor) -> None:
        """`tensor` (every row) in place of what the table had of its name."""
        self.arrays.pop(tensor.name, None)
        self.wire[tensor.name] = tensor

    def inputs(self, stage: Stage, rows: NDArray[np.intp]) -> list[v1.Tensor]:
        """The stage's model inputs over `rows`: forwarded as they are where that is every
        row (the rows are ascending, so as many as the table has are all of them)."""
        if len(rows) == self.total:
            return [named(self.tensor(source), name) for name, source in stage.inputs.items()]
        return [
            codec.to_tensor(name, self.array(source)[rows]) for name, source in stage.inputs.items()
        ]

    def chosen_by_member(self, chosen: NDArray[np.bool_]) -> NDArray[np.intp]:
        """How many of each member's rows `chosen` picks."""
        counts: NDArray[np.intp] = np.concatenate(([0], np.cumsum(chosen)))
        taking: NDArray[np.intp] = counts[self.starts[1:]] - counts[self.starts[:-1]]
        return taking

    def picked(
        self, indices: list[int], chosen: NDArray[np.bool_]
    ) -> tuple[NDArray[np.intp], list[int]]:
        """The chosen rows of members `indices` (ascending) as row numbers of the table, and
        how many of them each member has."""
        taking = self.chosen_by_member(chosen)
        counts = taking[indices]
        if counts.sum() == taking.sum():  # the usual call: every chosen row is theirs
            return np.flatnonzero(chosen), counts.tolist()
        among = np.zeros(len(self.members), dtype=bool)
        among[indices] = True
        return np.flatnonzero(chosen & among[self.owner]), counts.tolist()


def named(tensor: v1.Tensor, name: str) -> v1.Tensor:
    if tensor.name == name:
        return tensor
    return v1.Tensor(name=name, datatype=tensor.datatype, shape=tensor.shape, data=tensor.data)


def chosen_rows(table: Table, when: Condition | None) -> NDArray[np.bool_]:
    """Which rows of the flight the stage runs for."""
    if when is None:
        return np.ones(table.total, dtype=bool)
    return sends(when, measure(table.array(when.tensor).reshape(table.total, -1), when.measure))


def sends(when: Condition, measures: NDArray[np.float64]) -> NDArray[np.bool_]:
    """Which rows `when` sends to its stage, by their `measures` (a row whose measure is not
    a number is sent: nothing says it is sure)."""
    with np.errstate(invalid="ignore"):
        if when.below is not None:
            return ~(measures >= when.below)
        assert when.above is not None  # a condition has exactly one bound (its validator)
        return ~(measures <= when.above)


def measure(values: np.ndarray, kind: str) -> NDArray[np.float64]:
    """One number per row of `values` ([rows, n]). Worked on as [n, rows]: numpy reduces
    across a long axis several times faster than along a short one (a row of 10 logits)."""
    columns = np.array(values.T, dtype=np.float64, order="C")
    measured: NDArray[np.float64]  # numpy's stubs type a reduction over an axis as Any
    with np.errstate(invalid="ignore", over="ignore"):
        if kind == "max":
            measured = columns.max(axis=0)
        elif kind == "min":
            measured = columns.min(axis=0)
        else:
            columns -= columns.max(axis=0)
            np.exp(columns, out=columns)  # the top one is exp(0) = 1
            if kind == "top_probability":
                measured = 1.0 / columns.sum(axis=0)
            else:
                columns /= columns.sum(axis=0)
                top = np.sort(columns, axis=0)
                measured = top[-1] - (top[-2] if len(top) > 1 else 0.0)
    return measured


def renamed(outputs: list[v1.Tensor], names: dict[str, str]) -> list[v1.Tensor]:
    return [named(tensor, names.get(tensor.name, tensor.name)) for tensor in outputs]


def write(
    table: Table, stage: Stage, outputs: list[v1.Tensor], rows: NDArray[np.intp], fresh: set[str]
) -> None:
    """Write a stage's outputs into `rows` of the table (as they came where they are every
    row); a conditional stage writes over tensors an earlier stage gave, which must have the
    same kind of rows."""
    for tensor in outputs:
        name, shape = tensor.name, list(tensor.shape)
        if not shape or shape[0] != len(rows):
            raise NotReady(
                f"stage {stage.label!r}: model {stage.model.name!r} answered "
                f"{shape[0] if shape else 0} rows of {name!r} for {len(rows)}"
            )
        kept = _kept(table, stage, tensor, fresh)
        if len(rows) == table.total and kept in (None, tensor.datatype):
            check_declared(name, tensor.datatype, shape, len(tensor.data))
            table.put(tensor)
            continue
        array = codec.from_tensor(tensor)
        if kept is None:
            table.arrays[name] = np.zeros((table.total, *array.shape[1:]), array.dtype)
        present = table.array(name)
        if not present.flags.writeable:  # decoded from the wire: a view of its bytes
            present = table.arrays[name] = present.copy()
        table.wire.pop(name, None)  # written into: its bytes are no longer what it holds
        present[rows] = array


def _kept(table: Table, stage: Stage, tensor: v1.Tensor, fresh: set[str]) -> str | None:
    """The datatype of what the rows the stage passes over keep of `tensor`'s name; None
    where they keep nothing, the stage giving it anew."""
    name = tensor.name
    if stage.when is None and name not in fresh:
        fresh.add(name)
        return None
    before = table.kind(name)
    if before is None or before[1] != list(tensor.shape[1:]):
        raise NotReady(
            f"stage {stage.label!r} gives {name!r} with rows of shape "
            f"{list(tensor.shape[1:])} where the rows it passes over keep "
            f"{'nothing' if before is None else before[1]}"
        )
    return before[0]


def split(arrays: codec.Arrays, rows: Sequence[int]) -> list[codec.Arrays]:
    """Each member's rows of stacked `arrays` (views, no copies)."""
    if len(rows) == 1:
        return [arrays]
    bounds = [0, *accumulate(rows)]
    for name, array in arrays.items():
        if array.ndim == 0 or array.shape[0] != bounds[-1]:
            raise RuntimeError(
                f"output {name!r} of shape {list(array.shape)} is not stacked over "
                f"{bounds[-1]} rows"
            )
    return [
        {name: array[bounds[i] : bounds[i + 1]] for name, array in arrays.items()}
        for i in range(len(rows))
    ]
