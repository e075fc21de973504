"""`strata admin` against a real system: every command the docs show, weights set live
against a reload, and the refusals an operator meets."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from strata.tools.launch import Supervisor
from tests.support.system import ROOT, running_system

GATEWAY_TOKEN = "test-admin-token-of-at-least-32-characters"
MODELS_TOKEN = "test-models-token-of-at-least-32-chars"
STRATA = Path(sys.executable).parent / "strata"  # the console script pyproject.toml installs
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def documented_commands() -> list[str]:
    """Every `strata admin ...` line in the docs' code blocks, in order, comments cut."""
    commands = []
    for path in DOCS:
        inside = False
        for line in path.read_text().splitlines():
            text = line.strip()
            if text.startswith("```"):
                inside = not inside
            elif inside and text.startswith("strata admin "):
                commands.append(text.split(" #")[0].strip())
    return commands


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    folder = tmp_path_factory.mktemp("admin-cli")
    (folder / "admin-token").write_text(GATEWAY_TOKEN + "\n")
    changes = {"gateway": {"admin_token_file": "admin-token"}}
    env = {"STRATA_INFERENCE__ADMIN_TOKEN": MODELS_TOKEN}
    with running_system(folder, changes, env=env) as supervisor:
        yield supervisor


def strata_admin(
    system: Supervisor, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """The console script, with the system's config and inference's token in the environment
    (the gateway's comes from its file)."""
    environment = {**os.environ, "STRATA_CONFIG": str(system.config)}
    environment.update(env or {"STRATA_INFERENCE__ADMIN_TOKEN": MODELS_TOKEN})
    return subprocess.run(
        [str(STRATA), "admin", *args], capture_output=True, text=True, timeout=60, env=environment
    )


def as_json(system: Supervisor, *args: str) -> dict:
    done = strata_admin(system, "--json", *args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def live_weights(system: Supervisor) -> dict[str, float]:
    arms = as_json(system, "status")["pipelines"]["digits"]["arms"]
    return {arm["arm"]: arm.get("weight", 0.0) for arm in arms}


def test_the_docs_show_every_command() -> None:
    shown = {_action(shlex.split(command)[2:]) for command in documented_commands()}
    assert shown == {"status", "weights", "level", "reload", "index", "load", "unload"}


def test_every_documented_command_runs_against_a_real_system(system: Supervisor) -> None:
    address = system.address("gateway")
    for command in documented_commands():
        words = _without(shlex.split(command)[2:], "--config")
        if "--address" in words:
            words[words.index("--address") + 1] = address
        done = strata_admin(system, *words)
        assert done.returncode == 0, f"{command}: {done.stderr}"
        assert done.stdout.strip(), command
    as_json(system, "weights", "digits", "control=90", "canary=10")  # as the config has them


def test_weights_set_live_survive_a_reload_until_the_file_changes_them(
    system: Supervisor,
) -> None:
    assert as_json(system, "weights", "digits", "control=80", "canary=20")
    reply = as_json(system, "reload")
    assert reply.get("kept_live") == ["pipelines.digits.routes.weight"]
    assert live_weights(system) == {"control": 80, "canary": 20}
    arms = as_json(system, "status")["pipelines"]["digits"]["arms"]
    assert {a["arm"]: a["config_weight"] for a in arms} == {"control": 90, "canary": 10}
    original = system.config.read_text()
    raw = yaml.safe_load(original)
    raw["pipelines"]["digits"]["model"]["routes"][0]["weight"] = 70
    raw["pipelines"]["digits"]["model"]["routes"][1]["weight"] = 30
    system.config.write_text(yaml.safe_dump(raw))
    try:
        edited = as_json(system, "reload")
    finally:
        system.config.write_text(original)
        restored = as_json(system, "reload")
    assert edited.get("applied") == ["pipelines.digits.routes.weight"]
    assert "kept_live" not in edited
    assert restored.get("applied") == ["pipelines.digits.routes.weight"]
    assert live_weights(system) == {"control": 90, "canary": 10}


def test_refusals_say_what_to_do(system: Supervisor) -> None:
    unknown_arm = strata_admin(system, "weights", "digits", "a=50", "b=50")
    assert unknown_arm.returncode == 1
    assert (
        "INVALID_ARGUMENT: pipeline 'digits' has no arm 'a'; its arms: 'canary', 'control'"
        in unknown_arm.stderr
    )
    no_such = strata_admin(system, "weights", "digts", "control=1")
    assert no_such.returncode == 1
    assert "NOT_FOUND: unknown pipeline or stage 'digts'" in no_such.stderr
    assert "'digits', 'digits-cascade', 'tabular'" in no_such.stderr
    malformed = strata_admin(system, "weights", "digits", "control")
    assert malformed.returncode == 2 and "ARM=WEIGHT (control=80)" in malformed.stderr
    nowhere = strata_admin(system, "index", "--deployment", "c")
    assert nowhere.returncode == 2 and "no inference deployment 'c'" in nowhere.stderr
    tokenless = strata_admin(system, "index", env={"STRATA_INFERENCE__ADMIN_TOKEN": ""})
    assert tokenless.returncode == 2, tokenless.stderr
    assert re.search(r"no inference.admin_token .*STRATA_INFERENCE__ADMIN_TOKEN", tokenless.stderr)
    wrong = strata_admin(system, "index", env={"STRATA_INFERENCE__ADMIN_TOKEN": "x" * 40})
    assert wrong.returncode == 1 and "UNAUTHENTICATED" in wrong.stderr


def test_the_convert_subcommand_is_still_there() -> None:
    done = subprocess.run([str(STRATA), "convert", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--repository" in done.stdout


def _without(words: list[str], option: str) -> list[str]:
    """`words` without `option` and its value."""
    if option not in words:
        return words
    at = words.index(option)
    return words[:at] + words[at + 2 :]


def _action(words: list[str]) -> str:
    """The subcommand of `strata admin` WORDS."""
    for option in ("--config", "--address"):
        words = _without(words, option)
    return next(word for word in words if not word.startswith("--"))
