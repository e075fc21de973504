"""Preprocess steps: one interface, looked up by the name the config gives.

A step takes the tensors of one request (name -> array, batch dimension first) and returns
the tensors the next step sees. Stateless steps are pure numpy over the whole batch; stateful
steps load their parameters once, when they are built, and only look them up per request.
"""

# Importing each module registers its steps.
from services.preprocess.steps import (  # noqa: F401
    channels,
    color,
    decode,
    image,
    numeric,
    text,
    vocab,
)
from services.preprocess.steps.base import STEPS
from strata.plugins import Step, StepError

build_step = STEPS.build
build_step_options = STEPS.build_options

__all__ = ["STEPS", "Step", "StepError", "build_step", "build_step_options"]
