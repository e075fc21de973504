"""The step interface and the registry that builds steps from config."""

from __future__ import annotations

from typing import Protocol

from strata.errors import InvalidArgument
from strata.stages import Registry, Tensors, take

__all__ = ["STEPS", "Step", "StepError", "Tensors", "take"]


class StepError(InvalidArgument):
    """A request's tensors cannot go through a step; the message names the input and why."""


class Step(Protocol):
    """One stage of a preprocess pipeline."""

    name: str

    def process(self, tensors: Tensors) -> Tensors:
        """Return the tensors after this step; raise StepError for bad input."""
        ...


STEPS: Registry[Step] = Registry("preprocess step")
