"""YAML parsed by libyaml: the same documents and the same errors as PyYAML's own parser."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from strata import yamltext

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def test_it_reads_what_pyyaml_reads() -> None:
    text = CONFIG.read_text()
    assert yamltext.safe_load(text) == yaml.safe_load(text)
    assert yamltext.safe_load("") is None


def test_a_bad_document_gets_pyyamls_error_with_the_line_marked() -> None:
    text = "a: [1, 2\nb: 3\n"
    with pytest.raises(yaml.YAMLError) as theirs:
        yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError) as ours:
        yamltext.safe_load(text)
    assert str(ours.value) == str(theirs.value)
    assert "^" in str(ours.value)


def test_it_refuses_what_safe_load_refuses() -> None:
    with pytest.raises(yaml.YAMLError):
        yamltext.safe_load("!!python/object/apply:os.system ['true']")
