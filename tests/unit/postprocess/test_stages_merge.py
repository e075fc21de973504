"""The mean rule merges the outputs of models that ran side by side: weighted or not, of one
shape; inputs that differ in shape are the pipeline's fault (FAILED_PRECONDITION)."""

import numpy as np
import pytest
from pydantic import ValidationError

from services.postprocess.rules import build_rule
from strata.config.postprocess import MeanRule
from strata.errors import NotReady


def mean(**options):
    return build_rule(MeanRule(kind="mean", output="merged", **options), None)


def test_the_mean_of_two_tensors_weighted_or_not() -> None:
    tensors = {"a": np.array([[1.0, 3.0]], np.float32), "b": np.array([[3.0, 5.0]], np.float32)}
    plain = mean(inputs=["a", "b"]).apply(tensors, None)["merged"]
    assert plain.tolist() == [[2.0, 4.0]] and plain.dtype == np.float32
    weighted = mean(inputs=["a", "b"], weights=[3, 1]).apply(tensors, None)["merged"]
    assert weighted.tolist() == [[1.5, 3.5]]


def test_inputs_of_different_shapes_are_the_pipelines_fault() -> None:
    tensors = {"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 4), np.float32)}
    with pytest.raises(NotReady, match=r"mean: its inputs differ in shape: \{'a': \[2, 3\]"):
        mean(inputs=["a", "b"]).apply(tensors, None)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"inputs": ["a"]}, "at least 2 items"),
        ({"inputs": ["a", "b"], "weights": [1]}, "1 weights for 2 inputs"),
        ({"inputs": ["a", "b"], "weights": [0, 0]}, "not all 0"),
        ({"inputs": ["a", "b"], "weights": [1, -1]}, "at least 0"),
    ],
)
def test_the_config_refuses_a_mean_it_cannot_take(options: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        MeanRule(kind="mean", output="merged", **options)
