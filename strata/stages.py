"""What preprocess steps and postprocess rules share: a registry of named factories.

A stage maps a request's tensors (name -> array, batch first) to new tensors. Factories take
the stage's options from the config and the folder relative paths resolve against.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from strata.codec import Arrays
from strata.errors import InvalidArgument

T = TypeVar("T")
Factory = Callable[[Mapping[str, Any], Path], T]


class Registry(Generic[T]):
    """Factories by config name, for one kind of stage ("preprocess step", "rule")."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._factories: dict[str, Factory[T]] = {}

    def register(self, kind: str) -> Callable[[Factory[T]], Factory[T]]:
        def wrap(factory: Factory[T]) -> Factory[T]:
            self._factories[kind] = factory
            return factory

        return wrap

    def build(self, kind: str, options: Mapping[str, Any], base_dir: Path) -> T:
        """Build the stage named `kind`; config mistakes raise ValueError naming it."""
        try:
            factory = self._factories[kind]
        except KeyError:
            known = ", ".join(sorted(self._factories))
            raise ValueError(f"unknown {self.what} {kind!r} (known: {known})") from None
        try:
            return factory(options, base_dir)
        except KeyError as exc:
            raise ValueError(f"{self.what} {kind!r} needs option {exc.args[0]!r}") from None


def take(tensors: Arrays, name: str, stage: str) -> np.ndarray:
    """Fetch a tensor a stage needs, or fail naming it."""
    try:
        return tensors[name]
    except KeyError:
        raise InvalidArgument(f"{stage} needs tensor {name!r}, have {sorted(tensors)}") from None
