"""Training and serving preprocess the same way: the model builds' features are exactly what
the serving pipelines of configs/default.yaml make from the same client data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from models import digits, tabular
from models.build import train, write_model
from models.common import BuiltModel
from services.preprocess.app import build_pipelines
from services.preprocess.metrics import StepTimings
from strata.config import load_settings
from strata.config.preprocess import ResizeStep
from tests.support.system import DEFAULT_CONFIG

pytestmark = pytest.mark.slow  # builds (trains) the digits and tabular models

# Pipeline -> (client input, model input).
NAMES = {"digits": ("images", "pixels"), "tabular": ("features", "features")}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, BuiltModel]]:
    out = tmp_path_factory.mktemp("parity")
    models = {}
    for module in (digits, tabular):
        model = train(module.build, out / "repository")
        write_model(model, out)
        models[model.name] = model
    return out / "repository", models


@pytest.mark.parametrize("name", sorted(NAMES))
def test_serving_pipeline_reproduces_training_features(
    built: tuple[Path, dict[str, BuiltModel]], name: str
) -> None:
    repository, models = built
    settings = load_settings(DEFAULT_CONFIG)
    settings.repository = repository
    pipeline = build_pipelines(settings, StepTimings()).get(name)
    client_input, model_input = NAMES[name]
    model = models[name]
    rows = model.client_test[client_input]
    limit = settings.pipelines[name].max_batch_size
    # Served in request-sized batches, as clients would send them; rows never interact.
    served = np.concatenate(
        [
            pipeline.run({client_input: rows[start : start + limit]})[model_input]
            for start in range(0, len(rows), limit)
        ]
    )
    trained = model.test_inputs[model_input]
    assert served.dtype == trained.dtype and served.shape == trained.shape
    np.testing.assert_array_equal(served, trained)


def test_parity_would_catch_a_drifted_step(built: tuple[Path, dict[str, BuiltModel]]) -> None:
    """The check is not vacuous: serving with another interpolation gives other features."""
    repository, _ = built
    settings = load_settings(DEFAULT_CONFIG)
    settings.repository = repository
    drifted = ResizeStep(kind="resize", input="images", height=8, width=8, interpolation="nearest")
    settings.pipelines["digits"].preprocess[0] = drifted
    pipeline = build_pipelines(settings, StepTimings()).get("digits")
    images = np.random.default_rng(0).integers(0, 256, (4, 20, 20), dtype=np.uint8)
    served = pipeline.run({"images": images})["pixels"]
    trained = digits.run_steps(digits.STEPS, {"images": images}, repository)["pixels"]
    assert not np.array_equal(served, trained)
