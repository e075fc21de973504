"""The example plugin package through the gateway, as configs/plugins.yaml ships it: framed
digits are cropped back to the digit by its step, and a top score below 0.6 is answered
"uncertain" by its rule; a plugin's bug is UNAVAILABLE naming it, for its own request only."""

import json
import urllib.error
import urllib.request
from collections.abc import Iterator

import grpc
import numpy as np
import onnxruntime as ort
import orjson
import pytest
import yaml

from models.common import run_steps
from models.digits import STEPS as DIGITS_STEPS
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
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
DIGITS = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())["pipelines"]["digits"]
# Digits whose pixels start white lose their last pixel in preprocess: a pipeline that
# passes the check at start, whose model refuses what preprocess made for some requests.
SHRINK = {
    "kind": "tests.support.plugins:Shrink",
    "name": "shrink",
    "input": "pixels",
    "poison": 1.0,
}
SHRUNK = {**DIGITS, "preprocess": [*DIGITS["preprocess"], SHRINK]}
# Declares four scores where its rules make three: a rank the check at start finds right, a
# size only an answer shows.
MISDECLARED = {
    **DIGITS,
    "outputs": [{**spec, "shape": [-1, 4]} if spec["name"] == "scores" else spec
                for spec in DIGITS["outputs"]],
}  # fmt: skip
SCALE, BORDER = 5, 5  # each digit pixel becomes 5x5; a 5-pixel frame: 40 of 50 is the centre


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    pipelines = {
        "digits-cropped": PIPELINE,
        "fragile": FRAGILE,
        "shrunk": SHRUNK,
        "misdeclared": MISDECLARED,
    }
    changes = {"pipelines": pipelines}
    with running_system(tmp_path_factory.mktemp("plugins"), changes) as supervisor:
        yield supervisor


def infer(system: Supervisor, pipeline: str, images: np.ndarray) -> dict[str, np.ndarray]:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    request = codec.build_request(pipeline, {"images": images})
    return codec.response_outputs(stub.ModelInfer(request, timeout=30))


def rest_infer(system: Supervisor, pipeline: str, images: np.ndarray) -> urllib.error.HTTPError:
    """The HTTP error REST infer answers for `images`."""
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "UINT8",
                "shape": list(images.shape),
                "data": images.ravel().tolist(),
            }
        ]
    }
    url = f"http://{system.settings.services.gateway.rest}/v2/models/{pipeline}/infer"
    request = urllib.request.Request(url, orjson.dumps(body), {"content-type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    return refused.value


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


def test_a_model_refusing_what_preprocess_made_is_the_servers_fault(system) -> None:
    """Issue 51: FAILED_PRECONDITION (HTTP 500), logged at WARNING naming pipeline and stage;
    never INVALID_ARGUMENT, for the client sent what the pipeline declares."""
    images = np.zeros((1, 8, 8), np.uint8)
    assert infer(system, "shrunk", images)["labels"].shape == (1, 3)
    with pytest.raises(grpc.RpcError) as failed:
        infer(system, "shrunk", images + 255)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    message = (
        "pipeline 'shrunk': model 'digits' refused the tensors preprocess steps 'resize', "
        "'scale', 'flatten', 'shrink' made, not the client's: "
    )
    assert failed.value.details().startswith(message), failed.value.details()
    refused = rest_infer(system, "shrunk", images + 255)
    assert refused.code == 500
    assert orjson.loads(refused.read())["error"].startswith(message)
    logged = [
        json.loads(line)
        for line in (system.log_dir / "gateway.log").read_text().splitlines()
        if line.startswith("{") and message in line
    ]
    assert logged and {entry["level"] for entry in logged} >= {"WARNING"}


def test_an_output_the_rules_do_not_make_as_declared_is_the_servers_fault(system) -> None:
    """Postprocess's check of what it answers: FAILED_PRECONDITION naming pipeline and output,
    over REST a server's status (503), never 400: the client sent what the pipeline takes."""
    images = np.zeros((1, 8, 8), np.uint8)
    message = (
        "pipeline 'misdeclared': output 'scores' is FP32 [1, 3], but the pipeline declares "
        "FP32 [-1, 4]"
    )
    with pytest.raises(grpc.RpcError) as failed:
        infer(system, "misdeclared", images)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert message in failed.value.details()
    refused = rest_infer(system, "misdeclared", images)
    assert refused.code == 503
    assert message in orjson.loads(refused.read())["error"]
