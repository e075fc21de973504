"""A later stage may have a shadow, as the first model may: the config takes it, the
deployment it names must be one and loads the stage's model, and each version it may call is
checked at start against the stage's wiring like the stage's own. A fallback still takes
none."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from pydantic import ValidationError

from services.postprocess.rule_chain import build_chain
from strata.config import ConfigError, load_settings
from strata.config.postprocess import PostprocessSettings
from tests.support.system import make_config
from tests.unit.inference.test_inference_toymodels import pooling_model
from tests.unit.test_stages_wiring import LARGE, UNSURE, pipeline
from tests.unit.test_stages_wiring import root as root  # a fixture: pytest finds it here

MIRRORED = {**LARGE, "model": {"name": "big", "shadow": {"deployment": "b", "version": "2"}}}


def cascade(shadow: dict) -> dict:
    """The default config's digits cascade with `shadow` on its large stage."""
    large = {
        "name": "large",
        "model": {"name": "digits-large", "shadow": shadow},
        "inputs": {"pixels": "pixels"},
        "when": {"tensor": "logits", "below": 0.8},
    }
    return {"pipelines": {"digits-cascade": {"stages": [large]}}}


def test_a_stage_takes_a_shadow_and_a_fallback_still_takes_none() -> None:
    spec = pipeline([MIRRORED])
    assert spec.stages[0].model.shadow.deployment == "b"
    assert spec.stages[0].model.versions_called() == ["", "2"]
    shadowed = {"name": "m", "shadow": {"deployment": "a"}}
    for fallback in (
        {"stages": [{**LARGE, "fallback": {"model": shadowed}}]},
        {"fallback": {"model": shadowed}},
    ):
        with pytest.raises(ValidationError, match="a fallback model takes no shadow"):
            pipeline(**{"stages": [], **fallback})


def test_the_deployment_a_stage_shadow_names_loads_the_stage_model(tmp_path: Path) -> None:
    settings = load_settings(make_config(tmp_path, cascade({"deployment": "b"})))
    assert settings.models_of("b") == ["digits", "digits-large"]
    pinned = {**cascade({"deployment": "b"}), "inference": {"models": {"b": ["digits"]}}}
    with pytest.raises(ConfigError, match="'b', which does not load model 'digits-large'"):
        load_settings(make_config(tmp_path, pinned))


def test_a_stage_shadow_on_an_unknown_deployment_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"deployment 'c', not one of services\.inference"):
        load_settings(make_config(tmp_path, cascade({"deployment": "c"})))


def test_every_version_a_stage_shadow_may_call_is_checked_at_start(root: Path) -> None:
    folder = root / "big" / "2"
    folder.mkdir()
    onnx.save(pooling_model(), folder / "model.onnx")  # a version the stage cannot feed
    pinned = {**LARGE, "model": {"name": "big", "version": "1"}, "when": UNSURE}
    build_chain("p", pipeline([pinned]), root, PostprocessSettings())
    shadowed = {
        **pinned,
        "model": {**pinned["model"], "shadow": {"deployment": "b", "version": "2"}},
    }
    with pytest.raises(
        ValueError, match=r"stage 'large' \(model 'big' version 2\): the model takes no input 'x'"
    ):
        build_chain("p", pipeline([shadowed]), root, PostprocessSettings())
