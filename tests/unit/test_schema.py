"""Inputs checked at the door against their declared value range and sizes."""

import numpy as np
import pytest

from strata.config.pipelines import InputSpec
from strata.errors import InvalidArgument
from strata.shapes.schema import check_tensor

SPEC = InputSpec(name="x", datatype="FP32", shape=[-1, 2], range=(-10, 10), allow_nonfinite=True)


def test_values_within_the_range_pass_and_others_are_named() -> None:
    check_tensor(SPEC, np.array([[-10, 10], [0, 3]], np.float32))
    with pytest.raises(InvalidArgument, match=r"value 3.4e\+38 at \[1, 0\] is outside .*-10, 10"):
        check_tensor(SPEC, np.array([[0, 0], [3.4e38, 0]], np.float32))
    with pytest.raises(InvalidArgument, match="outside its declared range"):
        check_tensor(SPEC, np.array([[np.nan, 0]], np.float32))


def test_a_range_must_be_ordered_and_numeric() -> None:
    with pytest.raises(ValueError, match=r"must be \[low, high\]"):
        InputSpec(name="x", datatype="FP32", shape=[-1], range=(1, 0))
    with pytest.raises(ValueError, match="numeric datatypes only"):
        InputSpec(name="x", datatype="BYTES", shape=[-1], range=(0, 1))


def test_an_empty_tensor_passes_only_where_the_input_allows_it() -> None:
    empty = np.zeros(0, np.int32)
    check_tensor(InputSpec(name="IN", datatype="INT32", shape=[-1], allow_empty=True), empty)
    with pytest.raises(InvalidArgument, match=r"input 'IN': dimension 0 is 0, allowed 1\.\."):
        check_tensor(InputSpec(name="IN", datatype="INT32", shape=[-1]), empty)
