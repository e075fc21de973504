"""configs/text.yaml is configs/default.yaml plus the text models (its text pipelines route
to deployment a, which loads them), and stays so."""

from pathlib import Path

import yaml

from strata.config import load_settings
from strata.config.preprocess import TokenizeStep

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
TEXT_MODELS = {"minilm", "minilm-int8", "topics"}
TEXT_PIPELINES = {"embed", "embed-int8", "topics"}


def test_the_text_config_is_the_default_plus_the_text_models() -> None:
    default = yaml.safe_load((CONFIGS / "default.yaml").read_text())
    text = yaml.safe_load((CONFIGS / "text.yaml").read_text())
    pipelines, shared = text.pop("pipelines"), default.pop("pipelines")
    assert set(pipelines) == set(shared) | TEXT_PIPELINES
    for name, pipeline in shared.items():
        assert pipelines[name] == pipeline, f"pipeline {name!r} differs from configs/default.yaml's"
    for key in sorted(set(default) | set(text)):
        assert text.get(key) == default.get(key), (
            f"configs/text.yaml's {key!r} differs from configs/default.yaml's; copy it over"
        )


def test_the_text_config_loads_and_its_pipelines_use_the_text_models() -> None:
    settings = load_settings(CONFIGS / "text.yaml")
    used = {settings.pipelines[name].model.name for name in TEXT_PIPELINES}
    assert used == TEXT_MODELS
    assert set(settings.models_of("a")) == {"digits", "tabular", "digits-large"} | TEXT_MODELS
    for name in TEXT_PIPELINES:
        (step,) = settings.pipelines[name].preprocess
        assert isinstance(step, TokenizeStep)
        assert step.tokenizer == f"{settings.pipelines[name].model.name}/1/tokenizer.json"
