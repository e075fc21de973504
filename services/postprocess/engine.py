"""The rule engine: each pipeline's rules in order, then its declared outputs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.postprocess.rules import Rule, build_rule
from services.postprocess.rules.base import Tensors
from strata.config import Pipeline
from strata.errors import NotFound
from strata.stages import take


@dataclass
class RuleChain:
    name: str
    rules: list[Rule]
    outputs: list[str]

    def run(self, tensors: Tensors) -> Tensors:
        for rule in self.rules:
            tensors = rule.apply(tensors)
        return {
            name: take(tensors, name, f"pipeline {self.name!r} output") for name in self.outputs
        }


def build_chain(name: str, spec: Pipeline, repository: Path) -> RuleChain:
    rules = []
    for stage in spec.postprocess:
        try:
            rules.append(build_rule(stage.kind, stage.options, repository))
        except (ValueError, OSError) as exc:
            raise ValueError(f"pipeline {name!r}: postprocess rule {stage.kind!r}: {exc}") from exc
    return RuleChain(name=name, rules=rules, outputs=[o.name for o in spec.outputs])


class RuleEngine:
    def __init__(self, chains: dict[str, RuleChain]) -> None:
        self._chains = chains

    def get(self, name: str) -> RuleChain:
        try:
            return self._chains[name]
        except KeyError:
            raise NotFound(f"unknown pipeline {name!r}") from None
