"""The launcher: its restart backoff (doubling while an instance keeps failing, reset once it
has run long enough), how it names an exit, and the banner `make run` prints."""

import base64
from pathlib import Path

import numpy as np
import pytest
import yaml

from services.preprocess.steps import build_step_options
from strata.config import Settings, load_settings
from strata.config.pipelines import TensorSpec
from strata.tools.launch import EXAMPLE_PNG, Backoff, _example_input, banner, exit_reason
from strata.wire.codec import DTYPES
from tests.support.system import ROOT


def test_backoff_doubles_up_to_its_ceiling_and_resets_after_a_healthy_run() -> None:
    backoff = Backoff(first=0.5, longest=4.0, healthy_after=60.0)
    delays, previous = [], 0.0
    for _ in range(6):
        previous = backoff.after(previous, ran=1.0)
        delays.append(previous)
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.after(4.0, ran=61.0) == 0.5


def test_exit_reasons_name_the_signal() -> None:
    assert exit_reason(-9) == "was killed by SIGKILL"
    assert exit_reason(3) == "exited with 3"


def test_exit_reasons_say_why_a_restart_cannot_help() -> None:
    assert exit_reason(78) == "exited with 78 (the config is missing, unreadable or invalid)"


def only_pipeline(tmp_path: Path, config: Path, name: str) -> Settings:
    """`config` with `name` its only pipeline."""
    raw = yaml.safe_load(config.read_text())
    raw["pipelines"] = {name: raw["pipelines"][name]}
    raw["repository"] = str(config.parent / raw["repository"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_settings(path)


def client_code(text: str) -> str:
    """The banner's python heredoc, unindented."""
    body = text.split("<<'PY'\n")[1].split("  PY\n")[0]
    return "\n".join(line.removeprefix("  ") for line in body.splitlines())


@pytest.mark.parametrize(
    ("config", "pipeline", "says"),
    [
        ("default.yaml", "tabular", 'tc.InferInput("features", [1, 30], "FP32")'),
        ("text.yaml", "embed", 'np.full([1], b"an example", dtype=object)'),
    ],
)
def test_the_banner_calls_the_configs_own_pipeline(
    tmp_path: Path, config: str, pipeline: str, says: str
) -> None:
    text = banner(only_pipeline(tmp_path, ROOT / "configs" / config, pipeline))
    assert f'client.infer("{pipeline}", [x0])' in text and says in text
    assert "digits" not in text
    compile(client_code(text), "banner", "exec")


def test_the_banner_sends_a_real_image_to_a_pipeline_that_decodes_one(tmp_path: Path) -> None:
    """Issue 51: b"an example" sent to an image pipeline failed as printed."""
    config = ROOT / "configs" / "default.yaml"
    raw = yaml.safe_load(config.read_text())
    steps = [
        {"kind": "decode", "input": "image"},
        {"kind": "resize", "input": "image", "height": 8, "width": 8},
    ]
    photos = {
        **raw["pipelines"]["digits"],
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
    }
    raw["pipelines"] = {"photos": {**photos, "preprocess": steps}}
    raw["repository"] = str(config.parent / raw["repository"])
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    text = banner(load_settings(path))
    assert f'np.full([1], base64.b64decode("{EXAMPLE_PNG}"), dtype=object)' in text
    compile(client_code(text), "banner", "exec")
    decode = build_step_options("decode", steps[0], tmp_path)
    image = decode.process({"image": np.array([base64.b64decode(EXAMPLE_PNG)], dtype=object)})
    assert image["image"].shape == (1, 64, 64, 3)


@pytest.mark.parametrize("datatype", sorted(set(DTYPES) - {"BYTES"}))
def test_the_banner_names_each_datatype_as_numpy_does(datatype: str) -> None:
    # The launcher names them without importing numpy (it starts its children before that).
    line = _example_input(0, TensorSpec(name="x", datatype=datatype, shape=[-1, 2]))
    assert f"np.zeros([1, 2], np.{DTYPES[datatype].name})" in line
