"""Config loading: the default file is valid, and mistakes fail with messages that say where."""

import re
from pathlib import Path

import pytest
import yaml

from services.postprocess.rule_chain import build_chain
from services.preprocess.app import build_pipelines
from services.preprocess.metrics import StepTimings
from strata.config import ConfigError, load_settings
from strata.config.pipelines import Pipeline
from strata.config.preprocess import ResizeStep
from strata.wire.v2meta import model_config
from tests.support.system import DEFAULT_CONFIG, ROOT, merge


def write(tmp_path: Path, changes: dict) -> Path:
    raw = merge(yaml.safe_load(DEFAULT_CONFIG.read_text()), changes)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


IMAGES = {"name": "images", "datatype": "UINT8", "shape": [-1, -1, -1]}


def tabular_input(datatype: str, shape: list) -> dict:
    spec = {"name": "f", "datatype": datatype, "shape": shape}
    return {"pipelines": {"tabular": {"inputs": [spec]}}}


def test_default_config_loads_with_paths_resolved() -> None:
    settings = load_settings(DEFAULT_CONFIG)
    assert set(settings.pipelines) == {"digits", "digits-cascade", "tabular"}
    assert settings.services.gateway.listen.endswith(":8001")
    assert settings.repository.is_absolute()
    resize = settings.pipelines["digits"].preprocess[0]
    assert isinstance(resize, ResizeStep) and resize.height == 8


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"services": {"gateway": {"listen": "8001"}}}, ["services.gateway.listen", "host:port"]),
        ({"server": {"grace_seconds": -1}}, ["server.grace_seconds", "greater than 0"]),
        ({"server": {"colour": "blue"}}, ["server.colour", "Extra inputs"]),
        ({"inference": {"models": ["digits", "digits-large"]}}, ["tabular", "inference.models"]),
        ({"pipelines": {"digits": {"inputs": []}}}, ["pipelines.digits.inputs"]),
        (
            {
                "pipelines": {
                    "tabular": {"inputs": [{"name": "f", "datatype": "FP8", "shape": [1]}]}
                }
            },
            ["pipelines.tabular.inputs.0.datatype"],
        ),
        (
            {
                "pipelines": {
                    "tabular": {"inputs": [{"name": "f", "datatype": "FP32", "shape": [0]}]}
                }
            },
            ["positive or -1"],
        ),
        (
            {"pipelines": {"digits": {"inputs": [{**IMAGES, "format": "NHWC"}]}}},
            ["input images: format NHWC on a rank-3 shape", "needs max_batch_size 0"],
        ),
        (
            {"pipelines": {"digits": {"inputs": [{**IMAGES, "shape": [-1, 8], "format": "NHWC"}]}}},
            ["format NHWC needs rank 4 (batch first), or rank 3"],
        ),
        (
            {"pipelines": {"digits": {"inputs": [{**IMAGES, "format": "HWC"}]}}},
            ["pipelines.digits.inputs.0.format", "'NHWC' or 'NCHW'"],
        ),
        (
            {"pipelines": {"digits": {"inputs": [{**IMAGES, "labels": ["a"]}]}}},
            ["pipelines.digits.inputs.0.labels", "Extra inputs are not permitted"],
        ),
    ],
)
def test_invalid_configs_name_the_field(tmp_path: Path, changes: dict, words: list) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, changes))
    for word in words:
        assert word in str(info.value)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("services: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)
    bad.write_text("- a list")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_settings(bad)


def test_environment_overrides_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_SERVICES__GATEWAY__LISTEN", "0.0.0.0:9001")
    monkeypatch.setenv("STRATA_SERVER__GRACE_SECONDS", "7.5")
    settings = load_settings(DEFAULT_CONFIG)
    assert settings.services.gateway.listen == "0.0.0.0:9001"
    assert settings.server.grace_seconds == 7.5
    assert settings.services.preprocess.listen.endswith(":8101")


LOCAL_CONTROL = {"gateway": {"local_model_control": True}}


@pytest.mark.parametrize(
    ("services", "setting"),
    [
        ({"gateway": {"listen": "0.0.0.0:8001"}}, "services.gateway.listen"),
        ({"gateway": {"rest": "[::]:8000"}}, "services.gateway.rest"),
        ({"gateway": {"rest": "gateway.example:8000"}}, "services.gateway.rest"),
        ({"inference": {"b": {"listen": "10.0.0.5:8202"}}}, "services.inference.b"),
    ],
)
def test_tokenless_model_control_is_refused_off_loopback(
    tmp_path: Path, services: dict, setting: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(write(tmp_path, {**LOCAL_CONTROL, "services": services}))
    message = str(info.value)
    assert "gateway.local_model_control" in message and setting in message
    assert "without a token" in message and "loopback" in message


def test_tokenless_model_control_is_off_by_default_and_allowed_on_loopback(
    tmp_path: Path,
) -> None:
    assert not load_settings(DEFAULT_CONFIG).gateway.local_model_control
    services = {"gateway": {"listen": "[::1]:8001", "rest": "localhost:8000"}}
    settings = load_settings(write(tmp_path, {**LOCAL_CONTROL, "services": services}))
    assert settings.gateway.local_model_control


def test_a_rank_3_image_without_a_batch_dimension_is_described_as_triton_does(
    tmp_path: Path,
) -> None:
    """Triton's densenet_onnx: max_batch_size 0, dims [3, 224, 224], FORMAT_NCHW."""
    image = {"name": "images", "datatype": "FP32", "shape": [3, 224, 224], "format": "NCHW"}
    scores = {"name": "scores", "datatype": "FP32", "shape": [1000]}
    changes = {"max_batch_size": 0, "inputs": [image], "outputs": [scores], "postprocess": []}
    pipeline = load_settings(write(tmp_path, {"pipelines": {"digits": changes}})).pipelines[
        "digits"
    ]
    config = model_config("digits", "strata_pipeline", 0, pipeline.inputs, pipeline.outputs).config
    (described,) = config.input
    assert config.max_batch_size == 0 and list(described.dims) == [3, 224, 224]
    assert described.format == described.Format.FORMAT_NCHW


def readme_config() -> str:
    """README's smallest complete config."""
    text = (ROOT / "README.md").read_text().split("The smallest complete config", 1)[1]
    return re.search(r"^```yaml\n(.*?)^```", text, re.S | re.M).group(1)


def test_the_readmes_smallest_config_is_complete(tmp_path: Path) -> None:
    """Issue 51: `inference:` was required although each of its keys has a default."""
    raw = yaml.safe_load(readme_config())
    assert "inference" not in raw
    raw["repository"] = str(ROOT / raw["repository"])
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    settings = load_settings(path)
    build_pipelines(settings, StepTimings())  # the wiring checked against the model
    build_chain("tabular", settings.pipelines["tabular"], settings.repository, settings.postprocess)


def test_an_image_inputs_element_limit_follows_its_decode_step() -> None:
    """Issue 51: a phone photo (2-9 MB) passes the gateway where decode takes it."""
    base = {
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
        "model": {"name": "m"},
    }
    image = {"name": "image", "datatype": "BYTES", "shape": [-1]}
    decode = {"kind": "decode", "input": "image"}

    def limit(spec: dict, step: dict) -> int:
        pipeline = Pipeline.model_validate({**base, "inputs": [spec], "preprocess": [step]})
        return pipeline.inputs[0].max_element_bytes

    assert limit(image, decode) == 16 * 1024 * 1024
    assert limit(image, {**decode, "max_bytes": 1000}) == 1000
    assert limit({**image, "max_element_bytes": 5}, decode) == 5  # set: kept
    text = {"kind": "normalize_text", "input": "image"}
    assert limit(image, text) == 1 << 20
