"""The public interface of preprocess steps and postprocess rules: built-in or your own.

A step or rule is a class. A config stage names it by `kind`: a built-in, an import path
(`package.module:Name`) or an entry point of an installed package (groups `strata.steps` and
`strata.rules`). If the class has a nested pydantic model named `Options`, the stage's own
keys are validated by it when the service that runs the stage loads the config and the class
is built as `Name(options)`; otherwise as `Name()`, and a stage giving any key of its own is
refused. docs/plugins.md is the guide.

Tensors are a dict of name -> numpy array, batch first: a flight's stacked rows, so a stage
runs once per flight and must keep one row per input row. A stage never modifies the arrays
it is given; it returns a new dict (usually `{**tensors, name: new_array}`).

Errors: `StepError` (or any `strata.errors` error) is the request's fault and reaches the
client with its message; anything else a plugin raises is UNAVAILABLE naming the stage, and
only the rows of the requests that cause it fail.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict

from strata.errors import InvalidArgument, NotReady
from strata.wire.codec import Arrays, utf8

__all__ = [
    "Arrays",
    "Made",
    "NotFinite",
    "Options",
    "Rule",
    "RuleContext",
    "RuleTimeout",
    "Step",
    "StepError",
    "numbers",
    "strings",
    "take",
    "texts",
]


class Options(BaseModel):
    """A base for a plugin's `Options`: unknown keys are mistakes, refused at load time (as
    for the built-ins). Any pydantic model works; this one only saves the model_config."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@dataclass(frozen=True)
class Made:
    """What a stage makes of one tensor, as far as it knows: its v2 datatype and its rank
    (batch included); None where it does not say (a tensor written over keeps what was
    known of it).

    A step or rule may say what it makes with an attribute `outputs`, a mapping of tensor
    name -> Made: the tensors it writes, every other one passed on as it came. Strata then
    checks at start-up that the stages after it, and the model, get what they need. Without
    `outputs`, what follows the stage is checked only as far as it can be.
    """

    datatype: str | None = None
    rank: int | None = None


class StepError(InvalidArgument):
    """A request's tensors cannot go through a step; the message names the input and why.
    The client sees INVALID_ARGUMENT with this message."""


@runtime_checkable
class Step(Protocol):
    """One stage of a preprocess pipeline."""

    def process(self, tensors: Arrays) -> Arrays:
        """Return the tensors after this step; raise StepError for bad input."""
        ...


class RuleTimeout(TimeoutError):
    """A rule saw its time limit pass and stopped; the engine skips it."""


@dataclass(frozen=True)
class RuleContext:
    """What a running rule may ask of the engine: how long it has left."""

    # The moment by which the rule must be done: its own time limit, not the request's
    # deadline, on time.monotonic(), the clock of every Strata deadline (strata/wire/deadline.py).
    deadline: float

    def remaining(self) -> float:
        """Seconds left before the limit; raises RuleTimeout once it has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RuleTimeout("the rule's time limit passed")
        return left


@runtime_checkable
class Rule(Protocol):
    """One postprocess rule. It runs on a worker thread under a time limit; a rule that
    loops over many elements checks `context.remaining()` so it stops soon after its limit.
    It must never modify the arrays it is given: an abandoned rule may still be running
    while the chain carries on with them."""

    @property
    def inputs(self) -> tuple[str, ...]:
        """The tensors the rule reads (the engine skips it when an earlier skip left them out)."""
        ...

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        """Return the tensors after this rule, leaving the given arrays untouched."""
        ...


class NotFinite(NotReady):
    """A model answered NaN or infinity: no rule can make a meaningful answer of it."""


def take(tensors: Arrays, name: str, stage: str) -> np.ndarray:
    """Fetch a tensor a stage needs, or fail naming it (INVALID_ARGUMENT)."""
    try:
        return tensors[name]
    except KeyError:
        raise InvalidArgument(f"{stage} needs tensor {name!r}, have {sorted(tensors)}") from None


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


def numbers(tensors: Arrays, name: str, rule: str) -> np.ndarray:
    """A numeric tensor as FP32 (bool and integer tensors are widened); NaN and infinities
    (which a model answering finite input should never give) are refused, never passed on."""
    values = take(tensors, name, rule)
    if values.dtype.kind not in "biuf":
        raise InvalidArgument(f"{rule} needs a numeric tensor {name!r}, got {values.dtype}")
    values = values.astype(np.float32, copy=False)
    if values.dtype.kind == "f" and not np.isfinite(values).all():
        bad = int(values.size - np.isfinite(values).sum())
        raise NotFinite(
            f"{rule}: {bad} of the {values.size} values of {name!r} are NaN or infinite; "
            "the model's answer for this request is not a number"
        )
    return values


def texts(values: np.ndarray, name: str) -> list[str]:
    """The elements of a BYTES tensor as text, in flat order; non-UTF-8 is refused."""
    if values.dtype != object:
        raise InvalidArgument(f"tensor {name!r} must be BYTES, got {values.dtype}")
    return [utf8(item, f"tensor {name!r}", index) for index, item in enumerate(values.reshape(-1))]
