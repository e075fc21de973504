"""Triton's trace settings against the gateway's sampling: what each change makes of it, and
what is refused."""

from __future__ import annotations

import pytest

from services.gateway.api.server_settings import Tracing, _traced, _values
from strata.errors import InvalidArgument

CONFIGURED = Tracing(rate=4, on=True)  # telemetry.sample_ratio: 0.25


@pytest.mark.parametrize(
    ("key", "values", "after"),
    [
        ("trace_rate", ["10"], Tracing(10, True)),
        ("trace_level", ["OFF"], Tracing(2, False)),
        ("trace_level", ["TIMESTAMPS"], Tracing(2, True)),
        ("trace_rate", [], Tracing(4, True)),  # cleared: the config's
        ("trace_file", [""], Tracing(2, True)),  # what it is already
    ],
)
def test_a_change_moves_only_its_own_setting(key: str, values: list, after: Tracing) -> None:
    assert _traced(Tracing(2, True), key, values, CONFIGURED) == after


def test_the_ratio_is_one_in_rate_while_on() -> None:
    assert Tracing(4, True).ratio == 0.25 and Tracing(4, False).ratio == 0.0
    assert Tracing.of(0.25) == Tracing(4, True) and Tracing.of(0.0) == Tracing(1, False)


@pytest.mark.parametrize(
    ("key", "values", "words"),
    [
        ("trace_rate", ["0"], "trace_rate must be one whole number from 1"),
        ("trace_rate", ["1.5"], "trace_rate must be one whole number"),
        ("trace_rate", ["2", "3"], "trace_rate must be one whole number"),
        ("trace_level", ["TENSORS"], "never tensor values"),
        ("trace_file", ["/tmp/trace.json"], "trace_file cannot change"),
        ("trace_count", ["10"], "trace_count cannot change"),
        ("trace_colour", ["red"], "unknown trace setting 'trace_colour'"),
    ],
)
def test_what_cannot_be_set_is_refused(key: str, values: list, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        _traced(Tracing(2, True), key, values, CONFIGURED)


def test_rest_values_read_as_grpc_sends_them() -> None:
    assert _values("trace_rate", "3") == ["3"]
    assert _values("trace_rate", None) == []
    assert _values("trace_level", ["OFF"]) == ["OFF"]
    with pytest.raises(InvalidArgument, match="takes a string or a list of strings"):
        _values("trace_rate", 3)
