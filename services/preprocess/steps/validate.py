"""The first step of every pipeline: the request must match the declared inputs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from strata.config.pipelines import InputSpec
from strata.shapes.schema import validate_inputs
from strata.wire.codec import Arrays


@dataclass
class Validate:
    """Refuse tensors that do not match the pipeline's schema (raises InvalidArgument)."""

    inputs: Sequence[InputSpec]
    max_batch_size: int
    name: str = "validate"

    def process(self, tensors: Arrays) -> Arrays:
        validate_inputs(tensors, self.inputs, self.max_batch_size)
        return tensors
