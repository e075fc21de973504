"""Whose fault a model's refusal is.

A model refuses its inputs with INVALID_ARGUMENT, the right code for its own caller, the
gateway. The client sees it as such only where the client made those tensors: they went to
the model as the client sent them (and as the gateway checked them). Tensors a pipeline's
preprocess steps or an earlier model made are the server's: their refusal is a miswired
pipeline that the check at start did not catch (a size only some inputs give), answered
FAILED_PRECONDITION (HTTP 500) and logged at WARNING for the operator, naming the pipeline
and the stage.
"""

from __future__ import annotations

import logging

from strata.config.pipelines import Pipeline
from strata.errors import InvalidArgument, Miswired, StrataError

log = logging.getLogger(__name__)


def first_model(name: str, pipeline: Pipeline, exc: StrataError) -> StrataError:
    """`exc` of the pipeline's first model, as the client is to see it."""
    if not isinstance(exc, InvalidArgument) or not pipeline.preprocess:
        return exc
    steps = ", ".join(repr(step.label) for step in pipeline.preprocess)
    return _miswired(name, f"model {pipeline.model.name!r}", f"preprocess steps {steps}", exc)


def later_stage(name: str, stage: str, exc: StrataError) -> StrataError:
    """`exc` of a later stage's model (fed by preprocess and earlier models), likewise."""
    if not isinstance(exc, InvalidArgument):
        return exc
    return _miswired(name, f"stage {stage!r}", "preprocess and the models before it", exc)


def _miswired(name: str, stage: str, makers: str, exc: StrataError) -> Miswired:
    message = (
        f"pipeline {name!r}: {stage} refused the tensors {makers} made, not the client's: "
        f"{exc}; the pipeline does not fit its model"
    )
    log.warning("%s", message)
    return Miswired(message)
