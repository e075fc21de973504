"""A cascade condition left to its default measure, checked against the validation cases of
the model that gives its tensor: one that sends every row, or none, to its stage is a warning
naming a measure that tells them apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from services.gateway.flow.measure_check import warnings
from strata.config import load_settings
from strata.config.pipelines import Pipeline
from tests.support.system import DEFAULT_CONFIG, ROOT
from tests.unit.inference.test_inference_toymodels import write_case

PROBABILITIES = np.array([[0.9, 0.1], [0.6, 0.4], [0.2, 0.8], [0.55, 0.45]], np.float32)


def cascade(when: dict, outputs: dict | None = None) -> Pipeline:
    """small gives `probabilities`; large runs for the rows `when` picks."""
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 2]}],
            "model": {"name": "small"},
            "stages": [
                {
                    "model": {"name": "large"},
                    "inputs": {"x": "x"},
                    "outputs": outputs or {},
                    "when": when,
                }
            ],
        }
    )


@pytest.fixture
def root(tmp_path: Path) -> Path:
    x = np.zeros((2, 4), np.float32)
    for version, rows in ((1, PROBABILITIES[:2]), (2, PROBABILITIES[2:])):
        folder = tmp_path / "small" / str(version) / "validation"
        folder.mkdir(parents=True)
        write_case(folder / "case_000.npz", {"x": x}, {"probabilities": rows})
    return tmp_path


def test_probabilities_under_the_default_softmax_all_go_on_and_max_is_named(root: Path) -> None:
    found = warnings(root, {"p": cascade({"tensor": "probabilities", "below": 0.8})})
    assert found == [
        f"pipeline 'p': stage 'large' runs when top_probability (the default measure) of "
        f"'probabilities' is below 0.8, which sends all of the 2 rows of model 'small' version "
        f"{v}'s validation cases to it ('probabilities' already holds probabilities, each row "
        f"summing to 1, and top_probability takes their softmax again); set `measure: max` (it "
        f"sends 1 of them)"
        for v in (1, 2)
    ]


def test_a_condition_that_sends_none_is_named_too(root: Path) -> None:
    (found, _) = warnings(root, {"p": cascade({"tensor": "probabilities", "above": 0.9})})
    assert "which sends none of the 2 rows of model 'small' version 1's" in found
    assert found.endswith("no measure tells them apart at this bound: check the bound")


@pytest.mark.parametrize(
    "when",
    [
        {"tensor": "probabilities", "measure": "top_probability", "below": 0.8},  # named
        {"tensor": "probabilities", "below": 0.6},  # the default tells them apart
        {"tensor": "x", "below": 0.8},  # preprocess's: no model's cases hold it
    ],
)
def test_what_is_not_warned_of(root: Path, when: dict) -> None:
    assert warnings(root, {"p": cascade(when)}) == []


def test_the_shipped_cascade_and_its_cases_need_no_warning_even_by_default() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    spec = settings.pipelines["digits-cascade"].model_dump(exclude_unset=True)
    del spec["stages"][0]["when"]["measure"]  # top_probability, as it says
    pipelines = {"digits-cascade": Pipeline.model_validate(spec)}
    assert warnings(ROOT / "build" / "repository", pipelines) == []
