"""Which rows of a flight a conditional stage runs for (services/gateway/flow/rows.py): each
measure as its definition reads, row by row, over a flight's table of several members; a row
whose measure is not a number runs the stage; and the rows a call takes for some of the
members."""

import numpy as np
import pytest

from services.gateway.flow.flights import Member
from services.gateway.flow.rows import Table as Table
from services.gateway.flow.rows import chosen_rows as chosen_rows
from services.gateway.flow.rows import measure as measure
from strata.config.pipelines import Condition
from strata.wire import codec
from strata.wire.deadline import Deadline

MEASURES = ("top_probability", "margin", "max", "min")


def reference(values: np.ndarray, kind: str) -> np.ndarray:
    """The measure of each row, written out one row at a time."""
    out = []
    for row in values.astype(np.float64):
        if kind == "max":
            out.append(row.max())
        elif kind == "min":
            out.append(row.min())
        else:
            probabilities = np.exp(row - row.max()) / np.exp(row - row.max()).sum()
            top = np.sort(probabilities)[::-1]
            if kind == "top_probability":
                out.append(top[0])
            else:
                out.append(top[0] - (top[1] if len(top) > 1 else 0.0))
    return np.array(out)


def table(logits: np.ndarray, rows: list[int]) -> Table:
    members = [Member(f"request {i}", n, Deadline.after(5.0)) for i, n in enumerate(rows)]
    tensor = codec.to_tensor("logits", logits)
    return Table(members, {"logits": tensor}, ["logits"], {m: ["digits"] for m in members})


@pytest.mark.parametrize("kind", MEASURES)
@pytest.mark.parametrize("classes", [1, 2, 10])
def test_each_measure_is_its_definition_row_by_row(kind: str, classes: int) -> None:
    logits = (np.random.default_rng(classes).standard_normal((37, classes)) * 4).astype(np.float32)
    np.testing.assert_allclose(measure(logits, kind), reference(logits, kind), rtol=1e-12)


def test_the_measure_spans_each_rows_other_dimensions() -> None:
    logits = np.random.default_rng(0).standard_normal((4, 2, 5)).astype(np.float32)
    flight = table(logits, [1, 3])
    chosen = chosen_rows(flight, Condition(tensor="logits", measure="max", above=0.5))
    assert chosen.tolist() == (reference(logits.reshape(4, -1), "max") > 0.5).tolist()


@pytest.mark.parametrize("kind", MEASURES)
def test_a_row_that_is_not_a_number_runs_the_stage(kind: str) -> None:
    logits = np.array([[9.0, 0.0, 0.0], [np.nan, 0.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    flight = table(logits, [2, 1])
    below = chosen_rows(flight, Condition(tensor="logits", measure=kind, below=-1e9))
    above = chosen_rows(flight, Condition(tensor="logits", measure=kind, above=1e9))
    assert below.tolist() == above.tolist() == [False, True, False]


def test_a_cascade_takes_the_rows_whose_top_probability_is_below_its_bound() -> None:
    sure, unsure = [8.0, 0.0, 0.0], [1.0, 0.9, 0.0]
    logits = np.array([sure, unsure, sure, sure, unsure, unsure], np.float32)
    flight = table(logits, [2, 1, 3])
    chosen = chosen_rows(flight, Condition(tensor="logits", below=0.8))
    assert chosen.tolist() == [False, True, False, False, True, True]
    assert flight.chosen_by_member(chosen).tolist() == [1, 0, 2]
    rows, counts = flight.picked([0, 2], chosen)  # every member with a chosen row
    assert rows.tolist() == [1, 4, 5] and counts == [1, 2]
    rows, counts = flight.picked([2], chosen)  # member 0 left out (its budget, its arm)
    assert rows.tolist() == [4, 5] and counts == [2]
