"""The step interface, the registry that builds steps from config, and checks steps share."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from strata.codec import Arrays
from strata.config import preprocess as options
from strata.config.preprocess import StepSpec
from strata.errors import InvalidArgument
from strata.stages import Registry, take

__all__ = [
    "STEPS",
    "Step",
    "StepError",
    "resolve",
    "strings",
    "take",
]


class StepError(InvalidArgument):
    """A request's tensors cannot go through a step; the message names the input and why."""


class Step(Protocol):
    """One stage of a preprocess pipeline."""

    name: str

    def process(self, tensors: Arrays) -> Arrays:
        """Return the tensors after this step; raise StepError for bad input."""
        ...


STEPS: Registry[StepSpec, Step] = Registry("preprocess step", options.Step)


def strings(tensors: Arrays, name: str, stage: str) -> np.ndarray:
    """A BYTES tensor of shape [batch] or [batch, 1], as a flat object array of bytes."""
    values = take(tensors, name, stage)
    if values.dtype != object:
        raise StepError(f"input {name!r}: {stage} needs a BYTES tensor, got {values.dtype}")
    if values.ndim not in (1, 2) or (values.ndim == 2 and values.shape[1] != 1):
        raise StepError(
            f"input {name!r}: {stage} expects [batch] or [batch, 1] strings, "
            f"got shape {list(values.shape)}"
        )
    return values.reshape(-1)


def resolve(base_dir: Path, relative: str) -> Path:
    """A file option, relative to the folder the deployment keeps models in."""
    path = base_dir / relative
    if not path.is_file():
        raise ValueError(f"file {relative!r} not found under {base_dir}")
    return path
