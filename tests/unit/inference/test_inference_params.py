"""The v2 request parameters the inference service honours: priority, timeout, skip_batching."""

from __future__ import annotations

import pytest

from services.inference.params import request_options
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.deadline import Deadline


def params(**values: object) -> dict[str, v2.InferParameter]:
    out = {}
    for name, value in values.items():
        if isinstance(value, bool):
            out[name] = v2.InferParameter(bool_param=value)
        elif isinstance(value, int):
            out[name] = v2.InferParameter(int64_param=value)
        else:
            out[name] = v2.InferParameter(string_param=str(value))
    return out


def test_no_parameters_mean_default_priority_no_deadline_and_batching() -> None:
    options = request_options({}, None)
    assert (options.priority, options.deadline, options.skip_batching) == (0, None, False)


@pytest.mark.parametrize(
    ("remaining", "timeout_us", "left"),
    [(None, 250_000, 0.25), (0.1, 250_000, 0.1), (2.0, 250_000, 0.25), (0.5, 0, 0.5)],
)
def test_the_shorter_of_the_grpc_deadline_and_the_timeout_wins(
    remaining: float | None, timeout_us: int, left: float
) -> None:
    options = request_options(params(timeout=timeout_us), Deadline.within(remaining))
    assert options.deadline is not None
    assert options.deadline.left() == pytest.approx(left, abs=0.01)


def test_priority_and_skip_batching_are_read() -> None:
    options = request_options(params(priority=1, skip_batching=True), None)
    assert options.priority == 1 and options.skip_batching


def test_unsigned_priority_is_accepted() -> None:
    parameters = {"priority": v2.InferParameter(uint64_param=3)}
    assert request_options(parameters, None).priority == 3


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        (params(priority="high"), "'priority' must be an integer, got string_param"),
        (params(priority=-1), "'priority' must not be negative"),
        (params(timeout=True), "'timeout' must be an integer, got bool_param"),
        (params(skip_batching=1), "'skip_batching' must be a bool, got int64_param"),
    ],
)
def test_mistyped_parameters_are_refused(parameters: dict, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        request_options(parameters, None)
