"""A cascade condition's default measure, checked at start against the validation cases.

A stage's `when` without `measure` takes top_probability, the largest softmax probability of
each row. Given a tensor that already holds probabilities (a scikit-learn model's
`probabilities`), softmax flattens them again, every row falls below the bound, and every
row silently goes to the next stage. So at start the gateway applies each condition whose
measure was left to its default to the rows of the validation cases kept with the model
version that gives its tensor (`<model>/<version>/validation/*.npz`, which inference checks
each version against): a condition that sends every row of them, or none, to the stage is a
warning naming a measure that would tell them apart. A measure the config names is what the
operator meant, and is not second-guessed; a tensor no version's cases hold is not checked.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from services.gateway.flow.rows import measure, sends
from strata.config.pipelines import Condition, ModelRef, Pipeline, Stage
from strata.models import repository

MEASURES = ("max", "margin", "min", "top_probability")  # max first: what probabilities need


@dataclass(frozen=True)
class Rows:
    """A tensor's rows in one model version's validation cases, one row a line."""

    label: str  # "model 'small' version 1"
    values: np.ndarray


def warnings(root: Path, pipelines: Mapping[str, Pipeline]) -> list[str]:
    """A warning for each condition left to its default measure that sends every row of its
    tensor's validation cases, or none, to its stage."""
    found = []
    for name, pipeline in sorted(pipelines.items()):
        for index, stage in enumerate(pipeline.stages):
            when = stage.when
            if when is None or "measure" in when.model_fields_set:
                continue
            for rows in _case_rows(root, pipeline, index, when.tensor):
                found += _judged(name, stage, when, rows)
    return found


def _case_rows(root: Path, pipeline: Pipeline, index: int, tensor: str) -> Iterator[Rows]:
    """The rows of `tensor` in the validation cases of the latest model before stage `index`
    that gives it (a stage's outputs as it renames them), each version its routes call."""
    givers = [(pipeline.model, {}), *((s.model, s.outputs) for s in pipeline.stages[:index])]
    for model, renames in reversed(givers):
        source = {given: own for own, given in renames.items()}.get(tensor, tensor)
        found = list(_version_rows(root, model, source))
        if found:
            yield from found
            return


def _version_rows(root: Path, model: ModelRef, output: str) -> Iterator[Rows]:
    available = repository.versions(root / model.name)
    called = set(model.versions_called())
    numbers = sorted(available) if "" in called else sorted(int(v) for v in called if v.isdigit())
    for number in (n for n in numbers if n in available):
        cases = sorted((available[number] / "validation").glob("*.npz"))
        arrays = [_output(path, output) for path in cases]
        rows = [a.reshape(len(a), -1) for a in arrays if a is not None and a.ndim > 0 and len(a)]
        if rows and len({r.shape[1] for r in rows}) == 1:
            label = f"model {model.name!r} version {number}"
            yield Rows(label, np.concatenate(rows))


def _output(path: Path, name: str) -> np.ndarray | None:
    with np.load(path, allow_pickle=False) as case:
        key = f"output.{name}"
        return case[key] if key in case.files else None


def _sent(values: np.ndarray, when: Condition, kind: str) -> int:
    """How many rows the condition, with measure `kind`, sends to its stage (as the chain
    does: a row whose measure is not a number is sent)."""
    return int(sends(when, measure(values, kind)).sum())


def _judged(pipeline: str, stage: Stage, when: Condition, rows: Rows) -> list[str]:
    """The warning for one version's rows, if the default measure does not tell them apart."""
    total = len(rows.values)
    sent = _sent(rows.values, when, when.measure)
    if 0 < sent < total:
        return []
    bound = f"below {when.below}" if when.below is not None else f"above {when.above}"
    splits = [
        (kind, count)
        for kind in MEASURES
        if kind != when.measure and 0 < (count := _sent(rows.values, when, kind)) < total
    ]
    if splits:
        kind, count = splits[0]
        advice = f"set `measure: {kind}` (it sends {count} of them)"
    else:
        advice = "no measure tells them apart at this bound: check the bound"
    return [
        f"pipeline {pipeline!r}: stage {stage.label!r} runs when {when.measure} (the default "
        f"measure) of {when.tensor!r} is {bound}, which sends {'all' if sent else 'none'} of "
        f"the {total} rows of {rows.label}'s validation cases to it"
        f"{_probabilities_note(rows.values, when)}; {advice}"
    ]


def _probabilities_note(values: np.ndarray, when: Condition) -> str:
    """Why softmax misreads the tensor, where it already holds probabilities."""
    finite = np.isfinite(values).all()
    if not finite or values.min() < 0 or values.max() > 1:
        return ""
    if not np.allclose(values.sum(axis=1), 1.0, atol=1e-3):
        return ""
    return (
        f" ({when.tensor!r} already holds probabilities, each row summing to 1, and "
        f"{when.measure} takes their softmax again)"
    )
