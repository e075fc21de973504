"""The example plugin package through the gateway, as configs/plugins.yaml ships it: framed
digits are cropped back to the digit by its step, and a top score below 0.6 is answered
"uncertain" by its rule; a plugin's bug is UNAVAILABLE naming it, for its own request only."""

from collections.abc import Iterator

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import yaml

from models.common import run_steps
from models.digits import STEPS as DIGITS_STEPS
from strata import codec
from strata.launch import Supervisor
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import ROOT, running_system

BUILD = ROOT / "build"
SHIPPED = yaml.safe_load((ROOT / "configs" / "plugins.yaml").read_text())["pipelines"]
PIPELINE = SHIPPED["digits-cropped"]
THRESHOLD = PIPELINE["postprocess"][-1]["threshold"]
FRAGILE = {
    **PIPELINE,
    "preprocess": [
        {"kind": "tests.support.plugins:Fragile", "name": "fragile", "input": "images"},
        *PIPELINE["preprocess"],
    ],
}
SCALE, BORDER = 5, 5  # each digit pixel becomes 5x5; a 5-pixel frame: 40 of 50 is the centre


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {"pipelines": {"digits-cropped": PIPELINE, "fragile": FRAGILE}}
    with running_system(tmp_path_factory.mktemp("plugins"), changes) as supervisor:
        yield supervisor


def infer(system: Supervisor, pipeline: str, images: np.ndarray) -> dict[str, np.ndarray]:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    request = codec.build_request(pipeline, {"images": images})
    return codec.response_outputs(stub.ModelInfer(request, timeout=30))


def framed(digits: np.ndarray) -> np.ndarray:
    """Each 8x8 digit enlarged and framed so that its centre 80% is the enlarged digit."""
    large = digits.repeat(SCALE, axis=1).repeat(SCALE, axis=2)
    return np.pad(large, ((0, 0), (BORDER, BORDER), (BORDER, BORDER)), constant_values=0)


def top_scores(digits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The digits model version 1's top class and softmax score per digit, in-process."""
    tensors = run_steps(DIGITS_STEPS, {"images": digits}, BUILD / "repository")
    session = ort.InferenceSession(str(BUILD / "repository" / "digits" / "1" / "model.onnx"))
    logits = session.run(None, tensors)[0].astype(np.float64)
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    return probabilities.argmax(axis=1), probabilities.max(axis=1)


def test_the_example_plugins_crop_and_answer_uncertain_below_the_threshold(system) -> None:
    digits = np.load(BUILD / "data" / "digits_test.npz")["images"]
    classes, scores = top_scores(digits)
    order = np.argsort(scores)
    chosen = np.concatenate([order[:6], order[-6:]])  # the least and the most sure
    assert (scores[chosen] < THRESHOLD).any() and (scores[chosen] >= THRESHOLD).any()
    answer = infer(system, "digits-cropped", framed(digits[chosen]))
    np.testing.assert_allclose(answer["score"][:, 0], scores[chosen], rtol=1e-4)
    expected = [
        b"uncertain" if score < THRESHOLD else str(label).encode()
        for label, score in zip(classes[chosen], scores[chosen], strict=True)
    ]
    assert answer["label"][:, 0].tolist() == expected


def test_a_plugins_bug_is_unavailable_naming_it_and_fails_only_its_request(system) -> None:
    images = framed(np.zeros((1, 8, 8), np.uint8))
    assert infer(system, "fragile", images)["label"].shape == (1, 1)
    images[0, 0, 0] = 255  # Fragile's poison: the step raises RuntimeError
    with pytest.raises(grpc.RpcError) as failed:
        infer(system, "fragile", images)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "preprocess step 'fragile' failed: RuntimeError: a poisoned row" in (
        failed.value.details()
    )
    images[0, 0, 0] = 0
    assert infer(system, "fragile", images)["label"].shape == (1, 1)
