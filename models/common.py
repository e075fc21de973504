"""What each demo model's build hands to the writer, and running the serving steps."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from services.preprocess.steps import build_step_options

SEED = 0
TEST_SIZE = 0.25

StepSpec = tuple[str, Mapping[str, Any]]


@dataclass
class BuiltModel:
    """A trained, exported model with its test split, ready to be checked and written."""

    name: str
    graph: onnx.ModelProto
    labels: list[str]
    train_size: int
    # Model inputs for the test split, produced by the serving steps from `client_test`.
    test_inputs: dict[str, np.ndarray]
    test_labels: np.ndarray
    sklearn_predictions: np.ndarray
    # The test split as clients send it, before preprocessing.
    client_test: dict[str, np.ndarray]
    config: dict[str, Any] = field(default_factory=dict)
    version: str = "1"


def run_steps(
    steps: Sequence[StepSpec], tensors: dict[str, np.ndarray], base_dir: Path
) -> dict[str, np.ndarray]:
    """Run the preprocess steps the serving config names, with the serving code itself."""
    for kind, options in steps:
        tensors = build_step_options(kind, options, base_dir).process(tensors)
    return tensors
