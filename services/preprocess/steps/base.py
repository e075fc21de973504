"""The step interface, the registry that builds steps from config, and checks steps share."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from strata.codec import Arrays
from strata.errors import InvalidArgument
from strata.stages import Registry, take

__all__ = [
    "STEPS",
    "Step",
    "StepError",
    "positive_int",
    "resolve",
    "strings",
    "take",
    "utf8",
]


class StepError(InvalidArgument):
    """A request's tensors cannot go through a step; the message names the input and why."""


class Step(Protocol):
    """One stage of a preprocess pipeline."""

    name: str

    def process(self, tensors: Arrays) -> Arrays:
        """Return the tensors after this step; raise StepError for bad input."""
        ...


STEPS: Registry[Step] = Registry("preprocess step")


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


def utf8(item: object, name: str, index: int) -> str:
    """One BYTES element as text, refusing anything that is not valid UTF-8."""
    if isinstance(item, str):
        return item
    try:
        return bytes(item).decode("utf-8")  # type: ignore[call-overload]
    except UnicodeDecodeError as exc:
        raise StepError(
            f"input {name!r}: element {index} is not valid UTF-8 (byte {exc.start})"
        ) from None
    except TypeError:
        raise StepError(f"input {name!r}: element {index} is not a string") from None


def positive_int(options: Mapping[str, Any], key: str, default: int | None = None) -> int:
    """An integer option that must be at least 1 (ValueError naming it otherwise)."""
    raw = options[key] if default is None else options.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f"{key!r} must be a positive integer, got {raw!r}")
    return raw


def resolve(base_dir: Path, relative: str) -> Path:
    """A file option, relative to the folder the deployment keeps models in."""
    path = base_dir / relative
    if not path.is_file():
        raise ValueError(f"file {relative!r} not found under {base_dir}")
    return path
