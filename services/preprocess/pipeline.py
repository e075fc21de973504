"""A preprocess pipeline: the validation step, then the configured steps, in order."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from services.preprocess.steps import Step, build_step
from services.preprocess.steps.base import Tensors
from services.preprocess.steps.validate import Validate
from strata.config import Pipeline
from strata.errors import NotFound

log = logging.getLogger(__name__)


@dataclass
class PreprocessPipeline:
    name: str
    steps: list[Step]

    def run(self, tensors: Tensors) -> Tensors:
        for step in self.steps:
            tensors = step.process(tensors)
        return tensors


def build_pipeline(name: str, spec: Pipeline, repository: Path) -> PreprocessPipeline:
    """Build every step once; stateful steps load their files here, not per request."""
    steps: list[Step] = [Validate(spec.inputs, spec.max_batch_size)]
    for stage in spec.preprocess:
        try:
            steps.append(build_step(stage.kind, stage.options, repository))
        except (KeyError, ValueError, OSError) as exc:
            raise ValueError(f"pipeline {name!r}: preprocess step {stage.kind!r}: {exc}") from exc
    return PreprocessPipeline(name=name, steps=steps)


class Pipelines:
    """All pipelines of the deployment, looked up by name per request."""

    def __init__(self, pipelines: dict[str, PreprocessPipeline]) -> None:
        self._pipelines = pipelines

    def get(self, name: str) -> PreprocessPipeline:
        try:
            return self._pipelines[name]
        except KeyError:
            raise NotFound(f"unknown pipeline {name!r}") from None
