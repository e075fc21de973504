"""A model's fallback: a cheaper model that answers in its place, its answers marked degraded.

A later stage's fallback, or the pipeline's first model's, answers for the members its own
model could not answer (an arm unavailable, overloaded or failing, its circuit open, the
model not served there: the server's failures, not the request's) and, from the fallback's
degradation level on, for all of them before its model is tried. The chain hands the first
model's to `Stages.stand_in`, which runs that model as a stage of its own fallback. A
fallback's calls count in its arm's figures under `<pipeline>/<stage>/fallback`, the label
strata.stages shows for the answers it gave.
"""

from __future__ import annotations

from collections.abc import Iterable

from strata.config.pipelines import Fallback, Pipeline, Stage
from strata.errors import StrataError

# A degraded answer's source when a fallback model answered it.
FALLBACK = "fallback"
SUFFIX = "/fallback"  # a stage's label in strata.stages when its fallback answered
# Failures of a model that its fallback answers instead: the server's, not the request's (a
# bad input or a deadline that passed is the same for any model).
FALLS_BACK = {
    "UNAVAILABLE",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "NOT_FOUND",
    "INTERNAL",
    "UNKNOWN",
}


def answers_for(exc: StrataError) -> bool:
    """Whether a model's fallback answers for members its model failed with `exc`."""
    return exc.code.name in FALLS_BACK


def stands_in(pipeline: Pipeline, level: int) -> bool:
    """Whether the ladder's `level` sends a pipeline's requests to its first model's
    fallback before that model is tried."""
    return at_level(pipeline.fallback, level)


def at_level(fallback: Fallback | None, level: int) -> bool:
    """Whether the ladder's `level` sends requests to `fallback` before its model is tried."""
    return fallback is not None and fallback.from_level is not None and level >= fallback.from_level


def label(stage: Stage) -> str:
    """The label of `stage`'s fallback, in strata.stages and the arms' figures."""
    return stage.label + SUFFIX


def first_stage(pipeline: Pipeline, features: Iterable[str]) -> Stage:
    """The pipeline's first model as a stage fed by preprocess's outputs (`features`, each
    an input of the model, as start-up checked), with the pipeline's fallback."""
    model = pipeline.model.model_copy(update={"shadow": None})
    inputs = {name: name for name in features}
    return Stage(name=pipeline.model.name, model=model, inputs=inputs, fallback=pipeline.fallback)
