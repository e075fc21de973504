"""configs/text.yaml is configs/default.yaml plus the text models, and stays so; so are
configs/sequences.yaml, plus the stateful demo, and configs/decoupled.yaml, plus the
decoupled one."""

from pathlib import Path

import pytest
import yaml

from strata.config import load_settings
from strata.config.preprocess import TokenizeStep

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TEXT_MODELS = {"minilm", "minilm-int8", "topics"}
TEXT_PIPELINES = {"embed", "embed-int8", "topics", "topics-staged"}
STAGE_MODELS = {"topic-head"}  # topics-staged's second model


@pytest.mark.parametrize(
    ("file", "added_models", "added_pipelines"),
    [
        ("text.yaml", TEXT_MODELS, TEXT_PIPELINES),
        ("sequences.yaml", {"accumulator"}, {"counter"}),
        ("decoupled.yaml", {"repeat"}, {"repeat"}),
    ],
)
def test_the_config_is_the_default_plus_its_models(
    file: str, added_models: set[str], added_pipelines: set[str]
) -> None:
    default = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    text = yaml.safe_load((CONFIGS / file).read_text())
    pipelines, shared = text.pop("pipelines"), default.pop("pipelines")
    assert set(pipelines) == set(shared) | added_pipelines
    for name, pipeline in shared.items():
        assert pipelines[name] == pipeline, f"pipeline {name!r} differs from configs/default.yaml's"
    for key in sorted(set(default) | set(text)):
        assert text.get(key) == default.get(key), (
            f"configs/{file}'s {key!r} differs from configs/default.yaml's; copy it over"
        )
    settings = load_settings(CONFIGS / file)
    assert {settings.pipelines[name].model.name for name in added_pipelines} == added_models


def test_the_text_config_loads_and_its_pipelines_use_the_text_models() -> None:
    settings = load_settings(CONFIGS / "text.yaml")
    used = {settings.pipelines[name].model.name for name in TEXT_PIPELINES}
    assert used == TEXT_MODELS
    default = {"digits", "tabular", "digits-large"}
    assert set(settings.models_of("a")) == default | TEXT_MODELS | STAGE_MODELS
    for name in TEXT_PIPELINES:
        (step,) = settings.pipelines[name].preprocess
        assert isinstance(step, TokenizeStep)
        assert step.tokenizer == f"{settings.pipelines[name].model.name}/1/tokenizer.json"
