"""A model's fallback (services/gateway/flow/fallback.py): which failures it answers for,
from which degradation level it stands in first, its label, and the first model as a stage
of its own fallback."""

from __future__ import annotations

import pytest

from services.gateway.flow import fallback
from strata.config.pipelines import Stage
from strata.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MalformedReply,
    Miswired,
    NotFound,
    Overloaded,
    PermissionDenied,
    StrataError,
    Unavailable,
)
from tests.unit.gateway.flow.parts import pipeline


@pytest.mark.parametrize(
    "error",
    [
        Unavailable("down"),
        Overloaded("queue full"),
        Miswired("a size the check at start did not catch"),
        NotFound("model not served there"),
        MalformedReply("inference deployment 'd'", "short raw contents"),
    ],
)
def test_a_fallback_answers_for_the_servers_failures(error: StrataError) -> None:
    assert fallback.answers_for(error)


@pytest.mark.parametrize(
    "error",
    [InvalidArgument("bad input"), DeadlineExceeded("too late"), PermissionDenied("no")],
)
def test_a_fallback_does_not_answer_for_what_any_model_would_fail_the_same(
    error: StrataError,
) -> None:
    assert not fallback.answers_for(error)


def test_a_fallback_stands_in_before_its_model_from_its_level_on() -> None:
    from_two = pipeline(fallback={"model": {"name": "tiny"}, "from_level": 2})
    assert [fallback.stands_in(from_two, level) for level in range(5)] == [
        False,
        False,
        True,
        True,
        True,
    ]
    only_on_failure = pipeline(fallback={"model": {"name": "tiny"}})
    assert not any(fallback.stands_in(only_on_failure, level) for level in range(5))
    assert not fallback.stands_in(pipeline(), 4)


def test_a_fallbacks_label_is_its_stages_with_a_suffix() -> None:
    stage = Stage(name="rerank", model={"name": "large"}, inputs={"x": "x"})
    assert fallback.label(stage) == "rerank/fallback"
    assert fallback.label(stage).removesuffix(fallback.SUFFIX) == stage.label


def test_the_first_model_is_a_stage_of_its_fallback_fed_by_preprocess() -> None:
    spec = pipeline(
        model={"name": "small", "shadow": {"deployment": "d-mirror"}},
        fallback={"model": {"name": "tiny"}},
    )
    stage = fallback.first_stage(spec, ["x", "mask"])
    assert stage.label == "small" and stage.model.name == "small"
    assert stage.model.shadow is None, "a fallback's answers are never mirrored"
    assert stage.inputs == {"x": "x", "mask": "mask"}
    assert stage.fallback == spec.fallback
