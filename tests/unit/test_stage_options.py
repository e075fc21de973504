"""Step and rule options are config: the kinds it accepts are the kinds the services build,
and a mistake in an option stops the load, naming the pipeline, position, kind and key."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from services.postprocess.rules import RULES
from services.preprocess.steps import STEPS
from services.preprocess.steps.image import FILTERS
from strata.config import ConfigError, load_settings, preprocess
from strata.config.base import kinds
from strata.config.postprocess import BUILTIN_RULES
from strata.config.preprocess import BUILTIN_STEPS
from strata.wire.codec import DTYPES
from tests.support.system import DEFAULT_CONFIG

# The default config's digits pipeline: resize, scale, flatten; softmax, topk, labels.
DIGITS = yaml.safe_load(DEFAULT_CONFIG.read_text())["pipelines"]["digits"]


@pytest.mark.parametrize(("builtins", "registry"), [(BUILTIN_STEPS, STEPS), (BUILTIN_RULES, RULES)])
def test_the_config_types_exactly_the_kinds_the_services_build(builtins: Any, registry) -> None:
    assert kinds(builtins) == set(registry.classes)


def test_the_config_offers_exactly_the_choices_the_steps_implement() -> None:
    assert set(get_args(preprocess.Interpolation)) == set(FILTERS)
    assert set(get_args(preprocess.NumericDatatype)) == set(DTYPES) - {"BYTES"}


def load_with(tmp_path: Path, section: str, position: int, **changes: Any) -> None:
    """Load the default config, as the service that builds `section` does, with one of the
    digits pipeline's stages changed (None drops a key)."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    stages = raw["pipelines"]["digits"][section]
    merged = {**stages[position], **changes}
    stages[position] = {key: value for key, value in merged.items() if value is not None}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    load_settings(path, section)


@pytest.mark.parametrize(
    ("section", "position", "changes", "words"),
    [
        # A misspelt option.
        (
            "preprocess",
            0,
            {"heigth": 8},
            "pipelines.digits.preprocess.0.resize.heigth: Extra inputs are not permitted",
        ),
        # A rule-only key on a step is simply unknown there.
        ("preprocess", 1, {"core": False}, "preprocess.1.scale.core: Extra inputs"),
        # A wrong type: a count is a whole number, never a string or true/false.
        (
            "postprocess",
            1,
            {"k": "three"},
            "pipelines.digits.postprocess.1.topk.k: Input should be a valid integer",
        ),
        ("preprocess", 0, {"height": True}, "preprocess.0.resize.height: Input should be a valid"),
        # Out of range, and not one of the choices.
        (
            "preprocess",
            0,
            {"width": 0},
            "pipelines.digits.preprocess.0.resize.width: Input should be greater than 0",
        ),
        (
            "preprocess",
            0,
            {"interpolation": "cubic"},
            "preprocess.0.resize.interpolation: Input should be 'area', 'bilinear', 'bicubic', "
            "'lanczos' or 'nearest'",
        ),
        # A required option left out, and options that cannot go together.
        ("postprocess", 1, {"indices": None}, "postprocess.1.topk.indices: Field required"),
        ("postprocess", 2, {"labels": ["a"]}, "postprocess.2.labels: Value error, labels: give"),
        # An unknown kind: neither a built-in nor an installed entry point.
        (
            "postprocess",
            0,
            {"kind": "softermax"},
            "pipelines.digits.postprocess.0.kind: 'softermax' is neither a built-in postprocess "
            "rule (format, keyword_filter, ",
        ),
    ],
)
def test_option_mistakes_are_refused_at_load_time_naming_where(
    tmp_path: Path, section: str, position: int, changes: dict, words: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_with(tmp_path, section, position, **changes)
    assert words in str(info.value)


def test_the_default_options_load_as_typed_models() -> None:
    digits = load_settings(DEFAULT_CONFIG).pipelines["digits"]
    assert [step.label for step in digits.preprocess] == ["resize", "scale", "flatten"]
    assert [rule.label for rule in digits.postprocess] == ["softmax", "topk", "labels"]
    assert digits.postprocess[1].model_dump(exclude_defaults=True) == DIGITS["postprocess"][1]
