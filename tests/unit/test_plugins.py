"""Plugins: a stage's kind names user code by import path or entry point; the service that
runs the stage imports it and validates its options at load, with the built-ins' error
paths, while the gateway never imports it; a plugin's own failures are named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml
from strata_example_plugins.crop import CenterCrop
from strata_example_plugins.uncertain import UncertainBelow

from services.postprocess.rules import RULES
from services.preprocess.steps import STEPS
from strata.config import ConfigError, Settings, load_settings
from strata.config.postprocess import PluginRule
from strata.config.preprocess import PluginStep
from strata.errors import Unavailable
from strata.plugins import RuleContext, RuleTimeout, StepError
from tests.support import plugins
from tests.support.system import DEFAULT_CONFIG, ROOT

PLUGINS_CONFIG = ROOT / "configs" / "plugins.yaml"
FRAGILE = "tests.support.plugins:Fragile"
CROP = {"kind": "center_crop", "input": "images", "fraction": 0.8}
UNSURE_OPTIONS = {"scores": "scores", "labels": "labels", "threshold": 0.6}
UNSURE = {"kind": "uncertain_below", **UNSURE_OPTIONS}


def load(tmp_path: Path, service: str, section: str, *stages: dict[str, Any]) -> Settings:
    """The default config with `stages` put first in the digits pipeline's `section`, loaded
    as `service` loads it."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    digits = raw["pipelines"]["digits"]
    digits[section] = [*stages, *digits[section]]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_settings(path, service)


def refused(tmp_path: Path, section: str, *stages: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, section, section, *stages)
    return str(info.value)


# Finding the class and validating its options.


def test_an_import_path_names_a_class_and_its_options_are_validated(tmp_path: Path) -> None:
    settings = load(tmp_path, "preprocess", "preprocess", {"kind": FRAGILE, "input": "images"})
    stage = settings.pipelines["digits"].preprocess[0]
    assert isinstance(stage, PluginStep)
    plugin = stage.plugin(settings.repository)
    assert plugin.cls is plugins.Fragile
    assert plugin.options == plugins.Fragile.Options(input="images", poison=255)


def test_a_stage_is_config_whether_or_not_its_plugin_was_loaded(tmp_path: Path) -> None:
    """A live reload compares stages: one whose plugin was loaded (as preprocess loads it,
    in the same process as the gateway in the service tests) equals the same stage read
    again by the gateway, which loads no plugin, and differs from one with other options."""
    step = {"kind": FRAGILE, "input": "images"}
    built = load(tmp_path, "gateway", "preprocess", step)
    stage = built.pipelines["digits"].preprocess[0]
    stage.plugin(built.repository)
    again = load(tmp_path, "gateway", "preprocess", step)
    assert stage == again.pipelines["digits"].preprocess[0]
    other = load(tmp_path, "gateway", "preprocess", {**step, "input": "pixels"})
    assert stage != other.pipelines["digits"].preprocess[0]


def test_an_entry_point_names_an_installed_packages_class(tmp_path: Path) -> None:
    settings = load(tmp_path, "preprocess", "preprocess", CROP)
    plugin = settings.pipelines["digits"].preprocess[0].plugin(settings.repository)
    assert plugin.cls is CenterCrop
    assert plugin.options.fraction == 0.8


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        (
            "sharpen",
            "pipelines.digits.preprocess.0.kind: 'sharpen' is neither a built-in preprocess step "
            "(cast, clip, color, crop, decode, flatten, layout, normalize, normalize_text, pad, "
            "resize, scale, standardize, tokenize, vocabulary) nor an entry point in group "
            "'strata.steps' (installed: center_crop",
        ),
        (
            "no_such_package.steps:Sharpen",
            "pipelines.digits.preprocess.0.kind: cannot import 'no_such_package.steps:Sharpen': "
            "no module named 'no_such_package'",
        ),
        (
            "tests.support.plugins:Sharpen",
            "pipelines.digits.preprocess.0.kind: cannot import 'tests.support.plugins:Sharpen': "
            "module 'tests.support.plugins' has no 'Sharpen'",
        ),
        (
            "tests.support.plugins:NoProcess",
            "preprocess.0.kind: 'tests.support.plugins:NoProcess' is not a preprocess step: it "
            "has no method 'process'",
        ),
    ],
)
def test_a_kind_naming_no_usable_class_stops_the_load(
    tmp_path: Path, kind: str, words: str
) -> None:
    assert words in refused(tmp_path, "preprocess", {"kind": kind, "input": "images"})


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        (
            {"fraction": 1.5},
            "pipelines.digits.preprocess.0.center_crop.fraction: Input should be less than or "
            "equal to 1",
        ),
        ({"fraction": 0}, "preprocess.0.center_crop.fraction: Input should be greater than 0"),
        ({"fraction": None}, "pipelines.digits.preprocess.0.center_crop.fraction: Field required"),
        (
            {"fractoin": 0.5},
            "pipelines.digits.preprocess.0.center_crop.fractoin: Extra inputs are not permitted",
        ),
    ],
)
def test_bad_options_stop_the_load_naming_pipeline_position_kind_and_key(
    tmp_path: Path, changes: dict, words: str
) -> None:
    merged = {**CROP, **changes}
    stage = {key: value for key, value in merged.items() if value is not None}
    assert words in refused(tmp_path, "preprocess", stage)


def test_a_class_without_options_takes_no_keys(tmp_path: Path) -> None:
    bare = {"kind": "tests.support.plugins:Bare", "name": "bare"}
    settings = load(tmp_path, "preprocess", "preprocess", bare)
    assert settings.pipelines["digits"].preprocess[0].plugin(settings.repository).options is None
    words = refused(tmp_path, "preprocess", {**bare, "input": "images"})
    assert (
        "pipelines.digits.preprocess.0.tests.support.plugins:Bare.input: "
        "'tests.support.plugins:Bare' takes no options (no Options)"
    ) in words


def test_a_rules_shared_keys_stay_the_engines(tmp_path: Path) -> None:
    shared = {"name": "unsure", "core": False, "timeout_seconds": 0.25, "when": {"tensor": "x"}}
    settings = load(tmp_path, "postprocess", "postprocess", {**UNSURE, **shared})
    rule = settings.pipelines["digits"].postprocess[0]
    assert isinstance(rule, PluginRule)
    assert (rule.label, rule.core, rule.timeout_seconds) == ("unsure", False, 0.25)
    assert rule.plugin(settings.repository).options == UncertainBelow.Options(
        scores="scores", labels="labels", threshold=0.6
    )
    words = refused(tmp_path, "postprocess", {**UNSURE, "threshold": 2})
    assert "postprocess.0.uncertain_below.threshold: Input should be less than or equal to 1" in (
        words
    )


def test_only_the_service_that_runs_a_stage_imports_it(tmp_path: Path) -> None:
    """The gateway and inference carry a plugin stage unread; preprocess and postprocess each
    load only their own section's plugins."""
    step = {"kind": "not_installed_anywhere.steps:Step", "input": "images"}
    for service in ("gateway", "inference", "postprocess"):
        stage = load(tmp_path, service, "preprocess", step).pipelines["digits"].preprocess[0]
        assert stage.options == {"input": "images"} and stage._plugin is None
    assert "no module named 'not_installed_anywhere'" in refused(tmp_path, "preprocess", step)


# The guarantees around a built plugin.


def build_step(kind: str, **options: Any):
    return STEPS.build_options(kind, options, Path("."))


def test_a_plugins_bug_is_unavailable_naming_the_stage_and_step_error_stays_the_clients() -> None:
    fragile = build_step(FRAGILE, input="x", name="fragile")
    assert fragile.process({"x": np.zeros((2, 3))}).keys() == {"x"}
    with pytest.raises(Unavailable) as info:
        fragile.process({"x": np.full((2, 3), 255)})
    assert str(info.value) == "preprocess step 'fragile' failed: RuntimeError: a poisoned row"
    crop = build_step("center_crop", input="x", fraction=0.5)
    with pytest.raises(StepError) as bad:
        crop.process({"x": np.zeros((2, 3))})
    assert bad.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert "center_crop needs [batch, H, W]" in str(bad.value)


def test_a_plugin_rules_bug_is_unavailable_and_its_timeout_still_a_skip() -> None:
    context = RuleContext(deadline=float("inf"))
    fragile = RULES.build_options(FRAGILE, {"input": "logits", "poison": 7}, Path("."))
    assert fragile.inputs == ("logits",)
    with pytest.raises(Unavailable, match=r"postprocess rule 'tests.support.plugins:Fragile'"):
        fragile.apply({"logits": np.full((1, 2), 7.0)}, context)
    late = RULES.build_options("tests.support.plugins:Late", {}, Path("."))
    with pytest.raises(RuleTimeout):
        late.apply({"logits": np.zeros((1, 2))}, context)


# The example package.


def test_center_crop_keeps_the_centre_fraction_of_every_image() -> None:
    images = np.arange(2 * 10 * 10 * 3).reshape(2, 10, 10, 3)
    out = build_step("center_crop", input="x", fraction=0.8).process({"x": images})["x"]
    np.testing.assert_array_equal(out, images[:, 1:9, 1:9])
    tiny = build_step("center_crop", input="x", fraction=0.01).process({"x": images})["x"]
    assert tiny.shape == (2, 1, 1, 3)


def test_uncertain_below_relabels_unsure_rows_and_leaves_its_input_alone() -> None:
    rule = RULES.build_options("uncertain_below", UNSURE_OPTIONS, Path("."))
    scores = np.array([[0.9], [0.5], [0.6]], np.float32)
    labels = np.array([[b"3"], [b"5"], [b"7"]], object)
    out = rule.apply({"scores": scores, "labels": labels}, RuleContext(float("inf")))
    assert out["labels"].tolist() == [[b"3"], [b"uncertain"], [b"7"]]
    assert labels.tolist() == [[b"3"], [b"5"], [b"7"]]


# The shipped config.


def test_the_plugins_config_is_the_default_plus_its_pipeline() -> None:
    default = yaml.safe_load(DEFAULT_CONFIG.read_text())
    shipped = yaml.safe_load(PLUGINS_CONFIG.read_text())
    assert shipped["pipelines"].pop("digits-cropped")
    assert shipped == default, "configs/plugins.yaml differs from configs/default.yaml; copy over"


@pytest.mark.parametrize("service", ["gateway", "preprocess", "postprocess"])
def test_the_plugins_config_loads_for_every_service(service: str) -> None:
    assert "digits-cropped" in load_settings(PLUGINS_CONFIG, service).pipelines
