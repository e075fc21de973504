"""`strata admin` without a running system: whom each command calls, and usage mistakes."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from strata.config import load_settings
from strata.tools import admin_client
from tests.support.system import DEFAULT_CONFIG

TOKEN = "a-models-token-of-at-least-32-characters"


def parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    admin_client.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_load_reaches_every_local_replica_of_each_deployment(tmp_path: Path) -> None:
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["repository"] = str(DEFAULT_CONFIG.parent / raw["repository"])
    raw["services"]["inference"]["a"] = {"listen": "0.0.0.0:8201", "replicas": 2}
    raw["inference"]["admin_token"] = TOKEN
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    settings = load_settings(path)
    targets = admin_client._deployments(settings, parsed("load", "digits"))
    assert [t.name for t in targets] == ["a/0", "a/1", "b"]
    only_b = admin_client._deployments(settings, parsed("load", "digits", "--deployment", "b"))
    assert [t.name for t in only_b] == ["b"]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["weights", "digits", "control"], "weights are ARM=WEIGHT (control=80), not 'control'"),
        (["level", "high"], "level must be 0-4 or release, not 'high'"),
        (["status"], "the config sets no gateway.admin_token"),
    ],
)
def test_usage_mistakes_exit_2_saying_what_to_do(
    argv: list[str], says: str, capsys: pytest.CaptureFixture
) -> None:
    assert admin_client.main(["--config", str(DEFAULT_CONFIG), *argv]) == 2
    assert says in capsys.readouterr().err


def test_a_missing_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert admin_client.main(["--config", str(tmp_path / "nope.yaml"), "status"]) == 2
    assert "cannot read config" in capsys.readouterr().err
