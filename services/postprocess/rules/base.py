"""The rule interface, its registry, and the checks rules share.

A rule is a small named function from tensors to tensors. It runs on a worker thread with a
time limit; a rule that loops over many elements (a regex filter) checks `context.remaining()`
and passes it on as its own timeout, so it stops soon after its limit instead of running on.
Rules must never modify the arrays they are given: an abandoned rule may still be running
while the chain carries on with the same arrays.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import yaml

from strata.codec import Arrays, utf8
from strata.config import postprocess as options
from strata.config.postprocess import RuleSpec
from strata.errors import InvalidArgument, NotReady
from strata.stages import Registry, take

__all__ = [
    "RULES",
    "Misconfigured",
    "Rule",
    "RuleContext",
    "RuleTimeout",
    "load_list",
    "numbers",
    "take",
    "texts",
]


class RuleTimeout(TimeoutError):
    """A rule saw its time limit pass and stopped; the engine skips it."""


class Misconfigured(NotReady):
    """The pipeline's rules do not fit what the model returned; the message says how."""


@dataclass(frozen=True)
class RuleContext:
    """What a running rule may ask of the engine: how long it has left."""

    deadline: float  # time.monotonic() by which the rule must be done

    def remaining(self) -> float:
        """Seconds left before the limit; raises RuleTimeout once it has passed."""
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise RuleTimeout("the rule's time limit passed")
        return left


class Rule(Protocol):
    """One postprocess rule.

    A rule may also set the class attribute `bounded = True`: its cost follows its input's
    size and it can neither block nor run away (no I/O, no regex, no user callback). A chain
    of bounded rules over a small input then runs on the event loop, without the hand-off to
    a worker thread, which would cost more than the rules (see `is_bounded`).
    """

    name: str

    @property
    def inputs(self) -> tuple[str, ...]:
        """The tensors the rule reads (the engine skips it when an earlier skip left them out)."""
        ...

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        """Return the tensors after this rule, leaving the given arrays untouched."""
        ...


def is_bounded(rule: Rule) -> bool:
    """Whether `rule` declares itself bounded (absent: it is not)."""
    return bool(getattr(rule, "bounded", False))


RULES: Registry[RuleSpec, Rule] = Registry("postprocess rule", options.Rule)


class NotFinite(NotReady):
    """A model answered NaN or infinity: no rule can make a meaningful answer of it."""


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


def load_list(path: Path, what: str, key: str | None = None) -> list[str]:
    """A list of strings from .txt (one a line), .json or .yaml (a list, or a mapping's `key`)."""
    if not path.is_file():
        raise ValueError(f"{what} file {path} not found")
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".txt":
        body: Any = text.splitlines()
    elif path.suffix == ".json":
        body = json.loads(text)
    elif path.suffix in (".yaml", ".yml"):
        try:
            body = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{what} file {path.name} is not valid YAML: {exc}") from None
    else:
        raise ValueError(f"{what} file {path.name}: use .txt, .json or .yaml")
    if isinstance(body, dict) and key is not None:
        body = body.get(key)
    if not isinstance(body, list) or not body or not all(isinstance(v, str) for v in body):
        where = f" (or a mapping with {key!r})" if key else ""
        raise ValueError(f"{what} file {path.name} must hold a non-empty list of strings{where}")
    if "" in body:
        raise ValueError(f"{what} file {path.name}: entry {body.index('')} is empty")
    return body
