"""What preprocess steps and postprocess rules share: a registry of named factories.

A stage maps a request's tensors (name -> array, batch first) to new tensors. The config
declares each kind's options as a model (strata.config.preprocess and .postprocess); a
factory takes that model, already validated, and the folder relative paths resolve against.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np
from pydantic import TypeAdapter

from strata.codec import Arrays
from strata.errors import InvalidArgument


class Spec(Protocol):
    """A stage's config: its kind picks the factory."""

    @property
    def kind(self) -> str: ...


S = TypeVar("S", bound=Spec)
T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class Registry(Generic[S, T]):
    """Factories by kind, for one family of stage ("preprocess step", "postprocess rule").

    Each factory takes its kind's spec and the repository folder; `factories` maps every
    kind this family implements to its factory. `specs` is the family's config type (a union
    of models chosen by kind), for building from a plain mapping.
    """

    def __init__(self, what: str, specs: Any) -> None:
        self.what = what
        self._spec_type = specs
        self.factories: dict[str, Callable[[Any, Path], T]] = {}

    def register(self, kind: str) -> Callable[[F], F]:
        def wrap(factory: F) -> F:
            self.factories[kind] = factory
            return factory

        return wrap

    def build(self, spec: S, base_dir: Path) -> T:
        """Build the stage `spec` describes; what a file makes wrong raises ValueError."""
        try:
            factory = self.factories[spec.kind]
        except KeyError:
            known = ", ".join(sorted(self.factories))
            raise ValueError(f"unknown {self.what} {spec.kind!r} (known: {known})") from None
        return factory(spec, base_dir)

    def build_options(self, kind: str, options: Mapping[str, Any], base_dir: Path) -> T:
        """Build from a plain mapping, validated as the config file's stages are (for tools
        and tests; pydantic's ValidationError names a wrong option)."""
        return self.build(self._specs.validate_python({"kind": kind, **options}), base_dir)

    @functools.cached_property
    def _specs(self) -> TypeAdapter[S]:
        """Built on first use: serving validates stages with the config, never here."""
        return TypeAdapter(self._spec_type)


def take(tensors: Arrays, name: str, stage: str) -> np.ndarray:
    """Fetch a tensor a stage needs, or fail naming it."""
    try:
        return tensors[name]
    except KeyError:
        raise InvalidArgument(f"{stage} needs tensor {name!r}, have {sorted(tensors)}") from None
