"""The demo model build: artifacts, accuracy, fingerprints, determinism, golden cases."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
import yaml

from models.build import build_all
from strata.models.normalisation import load_stats
from tests.support.system import ROOT

# Builds the demo models once (make test-unit leaves it out): about 17 s of CPU, digits-large's
# training most of it, so longer on a busy machine than the suite's default time limit.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

IO_NAMES = {"digits": ("pixels", "logits"), "tabular": ("features", "logits")}
MIN_ACCURACY = {"digits": 0.95, "tabular": 0.93}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    out = tmp_path_factory.mktemp("build")
    return out, build_all(out)


def _session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("name", sorted(IO_NAMES))
def test_files_exist(built: tuple[Path, dict[str, float]], name: str) -> None:
    out, _ = built
    model = out / "repository" / name
    assert (model / "model.yaml").is_file()
    assert (model / "1" / "model.onnx").is_file()
    assert len(sorted((model / "1" / "validation").glob("case_*.npz"))) == 3
    assert (out / "data" / f"{name}_test.npz").is_file()


@pytest.mark.parametrize("name", sorted(IO_NAMES))
def test_onnx_signature_has_dynamic_batch(built: tuple[Path, dict[str, float]], name: str) -> None:
    out, _ = built
    session = _session(out / "repository" / name / "1" / "model.onnx")
    (model_input,), (model_output,) = session.get_inputs(), session.get_outputs()
    assert (model_input.name, model_output.name) == IO_NAMES[name]
    assert model_input.shape[0] == "batch"
    assert model_output.shape[0] == "batch"


@pytest.mark.parametrize("name", sorted(IO_NAMES))
def test_accuracy(built: tuple[Path, dict[str, float]], name: str) -> None:
    _, accuracies = built
    assert accuracies[name] >= MIN_ACCURACY[name]


def test_model_config(built: tuple[Path, dict[str, float]]) -> None:
    out, _ = built
    repository = out / "repository"
    digits = yaml.safe_load((repository / "digits" / "model.yaml").read_text())
    tabular = yaml.safe_load((repository / "tabular" / "model.yaml").read_text())
    assert digits["labels"] == [str(digit) for digit in range(10)]
    assert tabular["labels"] == ["malignant", "benign"]
    assert digits["max_batch_size"] == tabular["max_batch_size"] == 64
    stats = load_stats(repository / "tabular" / "1" / "stats.json")
    assert tabular["preprocess_fingerprint"] == stats.fingerprint


def test_client_data_is_raw(built: tuple[Path, dict[str, float]]) -> None:
    out, _ = built
    with np.load(out / "data" / "digits_test.npz") as digits:
        assert digits["images"].dtype == np.uint8
        assert digits["images"].shape[1:] == (8, 8)
        assert digits["images"].max() == 255
    with np.load(out / "data" / "tabular_test.npz") as tabular:
        assert tabular["features"].dtype == np.float32
        # Raw measurements, not standardised: some are in the hundreds.
        assert tabular["features"].max() > 100


def test_build_is_deterministic(built: tuple[Path, dict[str, float]]) -> None:
    """This module's build writes what `make models` wrote into build/, from another process
    (which `make test` runs first: one build here, not two)."""
    out, _ = built
    made = ROOT / "build"
    for first in sorted((out / "repository").rglob("model.onnx")):
        second = made / first.relative_to(out)
        assert second.is_file(), f"{second} is missing: run `make models`"
        same = first.read_bytes() == second.read_bytes()
        assert same, f"{second} differs from a new build (stale? `make models` rebuilds it)"


VERSIONS = {"digits": ["1", "2"], "tabular": ["1"]}
CASES = 3  # golden cases models/build.py writes for each version


@pytest.mark.parametrize("name", sorted(IO_NAMES))
def test_validation_cases_reproduce(built: tuple[Path, dict[str, float]], name: str) -> None:
    out, _ = built
    input_name, output_name = IO_NAMES[name]
    for version in VERSIONS[name]:
        folder = out / "repository" / name / version
        cases = sorted((folder / "validation").glob("case_*.npz"))
        assert len(cases) == CASES, f"{folder / 'validation'} holds {len(cases)} cases"
        session = _session(folder / "model.onnx")
        for path in cases:
            with np.load(path) as case:
                (actual,) = session.run([output_name], {input_name: case[f"input.{input_name}"]})
                np.testing.assert_allclose(
                    actual,
                    case[f"output.{output_name}"],
                    atol=float(case["atol"]),
                    rtol=float(case["rtol"]),
                    err_msg=str(path),
                )


def test_digits_has_a_second_version_for_ab_routing(built: tuple[Path, dict[str, float]]) -> None:
    out, accuracies = built
    folder = out / "repository" / "digits"
    assert (folder / "2" / "model.onnx").exists() and (folder / "2" / "validation").is_dir()
    assert yaml.safe_load((folder / "model.yaml").read_text())["version_policy"] == {"all": True}
    assert accuracies["digits@2"] >= MIN_ACCURACY["digits"]
    assert (folder / "1" / "model.onnx").read_bytes() != (folder / "2" / "model.onnx").read_bytes()
