"""The whole chain through the gateway, called with tritonclient as users do."""

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from models.common import run_steps
from models.digits import STEPS as DIGITS_STEPS
from tests.support.system import ROOT, run_client

BUILD = ROOT / "build"


@pytest.fixture(scope="module")
def probe(gateway: str) -> dict:
    return run_client("triton_probe", gateway)


def test_server_and_pipelines_are_described(probe: dict) -> None:
    assert probe["live"] and probe["ready"]
    assert probe["server"]["name"] == "strata"
    digits = probe["metadata"]["digits"]
    assert digits["inputs"] == [{"name": "images", "datatype": "UINT8", "shape": ["-1"] * 3}]
    assert [o["name"] for o in digits["outputs"]] == ["labels", "scores"]
    tabular = probe["config"]["tabular"]["config"]
    assert tabular["max_batch_size"] == 64
    assert tabular["input"] == [{"name": "features", "data_type": "TYPE_FP32", "dims": ["30"]}]
    assert probe["model_ready"] == {"digits": True, "tabular": True, "nope": False}


@pytest.mark.parametrize(
    ("case", "code", "words"),
    [
        ("wrong_datatype", "INVALID_ARGUMENT", ["images", "FP32", "UINT8"]),
        ("wrong_shape", "INVALID_ARGUMENT", ["images", "rank"]),
        ("unknown_input", "INVALID_ARGUMENT", ["pixels", "images"]),
        ("unknown_pipeline", "NOT_FOUND", ["nope"]),
        ("wrong_features", "INVALID_ARGUMENT", ["features", "dimension 1", "30"]),
    ],
)
def test_bad_requests_get_clear_errors(probe: dict, case: str, code: str, words: list) -> None:
    error = probe["errors"][case]
    assert error["status"] == f"StatusCode.{code}"
    for word in words:
        assert word in error["message"]


def in_process_digits_accuracy(images: np.ndarray, labels: np.ndarray) -> float:
    tensors = run_steps(DIGITS_STEPS, {"images": images}, BUILD / "repository")
    session = ort.InferenceSession(str(BUILD / "repository" / "digits" / "1" / "model.onnx"))
    logits = session.run(None, tensors)[0]
    return float((logits.argmax(axis=1) == labels).mean())


def predict(gateway: str, pipeline: str, npz: Path, key: str, output: str) -> tuple[list, list]:
    """Top labels the chain gives for the data set, and the true labels."""
    predicted = run_client("triton_predict", gateway, pipeline, str(npz), key, key, output, "16")
    return predicted, np.load(npz)["labels"].tolist()


def test_digits_accuracy_through_the_chain_matches_in_process(gateway: str) -> None:
    npz = BUILD / "data" / "digits_test.npz"
    predicted, labels = predict(gateway, "digits", npz, "images", "labels")
    chain = np.mean([int(p) == y for p, y in zip(predicted, labels, strict=True)])
    data = np.load(npz)
    reference = in_process_digits_accuracy(data["images"], data["labels"])
    assert reference > 0.95
    assert abs(chain - reference) <= 0.01


def test_tabular_predictions_through_the_chain(gateway: str) -> None:
    npz = BUILD / "data" / "tabular_test.npz"
    predicted, labels = predict(gateway, "tabular", npz, "features", "label")
    names = ["malignant", "benign"]
    accuracy = np.mean([names.index(p) == y for p, y in zip(predicted, labels, strict=True)])
    assert accuracy > 0.93


def test_the_stream_answers_each_request_and_reports_bad_ones_in_it(gateway: str) -> None:
    answers = run_client("triton_stream", gateway, "6")
    good = sorted(a["id"] for a in answers if "id" in a)
    bad = [a["error"] for a in answers if "error" in a]
    assert good == ["0", "2", "4"]
    assert len(bad) == 3 and all("INVALID_ARGUMENT" in e and "FP32" in e for e in bad)
