"""The rule interface and its registry."""

from __future__ import annotations

from typing import Protocol

from strata.stages import Registry, Tensors

__all__ = ["RULES", "Rule", "Tensors"]


class Rule(Protocol):
    """One postprocess rule."""

    name: str

    def apply(self, tensors: Tensors) -> Tensors:
        """Return the tensors after this rule."""
        ...


RULES: Registry[Rule] = Registry("postprocess rule")
