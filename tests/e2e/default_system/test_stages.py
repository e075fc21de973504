"""A pipeline of several models through the real chain: the default config's digits cascade
answers each row as digits then, only where digits is unsure, digits-large would (computed
here in ONNX Runtime from the same files), says which models answered in strata.stages, and
does so for concurrent requests that share flights; a one-model pipeline is unchanged."""

from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import onnxruntime as ort
import pytest

from models.common import run_steps
from models.digits import STEPS as DIGITS_STEPS
from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import DEFAULT_CONFIG, ROOT

BUILD = ROOT / "build"
ROWS = 3  # rows per request


def cascade(images: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """What the config's cascade answers, in process: each row's class and whether
    digits-large answered it."""
    stage = load_settings(DEFAULT_CONFIG).pipelines["digits-cascade"].stages[0]
    small = logits("digits", images)
    shifted = np.exp(small - small.max(axis=1, keepdims=True))
    unsure = (shifted / shifted.sum(axis=1, keepdims=True)).max(axis=1) < stage.when.below
    large = logits("digits-large", images)
    return np.where(unsure, large.argmax(axis=1), small.argmax(axis=1)), unsure


def logits(model: str, images: np.ndarray, version: str = "1") -> np.ndarray:
    """A version of `model` on client images, in process."""
    pixels = run_steps(DIGITS_STEPS, {"images": images}, BUILD / "repository")["pixels"]
    path = BUILD / "repository" / model / version / "model.onnx"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"pixels": pixels})[0]


@pytest.fixture(scope="module")
def stub(gateway: str) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(gateway))


def infer(stub, pipeline: str, images: np.ndarray):
    return stub.ModelInfer(codec.build_request(pipeline, {"images": images}), timeout=30)


def test_the_cascade_answers_as_its_models_would_and_says_which_answered(stub) -> None:
    data = np.load(BUILD / "data" / "digits_test.npz")
    images = data["images"][: len(data["images"]) // ROWS * ROWS]
    expected, unsure = cascade(images)
    assert 0 < unsure.sum() < len(unsure) / 4, "some rows, not most, go on to digits-large"
    batches = np.split(images, len(images) // ROWS)
    with ThreadPoolExecutor(16) as pool:  # concurrent requests share flights
        replies = list(pool.map(lambda batch: infer(stub, "digits-cascade", batch), batches))
    labels = np.concatenate([codec.response_outputs(r)["labels"][:, 0] for r in replies])
    assert [int(label) for label in labels] == expected.tolist()
    for reply, rows_unsure in zip(replies, np.split(unsure, len(batches)), strict=True):
        stages = reply.parameters["strata.stages"].string_param
        assert stages == ("digits,large" if rows_unsure.any() else "digits")
        assert not reply.parameters["strata.degraded"].bool_param
    accuracy = float((expected == data["labels"][: len(expected)]).mean())
    assert accuracy > 0.97


def test_a_request_whose_rows_all_go_on_gets_the_large_models_answers(stub) -> None:
    """Every row of the flight takes the stage: its answer replaces the first model's whole."""
    data = np.load(BUILD / "data" / "digits_test.npz")
    expected, unsure = cascade(data["images"])
    reply = infer(stub, "digits-cascade", data["images"][unsure][:ROWS])
    assert reply.parameters["strata.stages"].string_param == "digits,large"
    labels = codec.response_outputs(reply)["labels"][:, 0]
    assert [int(label) for label in labels] == expected[unsure][:ROWS].tolist()


def test_a_one_model_pipeline_answers_as_before(stub) -> None:
    reply = infer(stub, "digits", np.zeros((2, 8, 8), np.uint8))
    assert "strata.stages" not in reply.parameters
    assert codec.response_outputs(reply)["scores"].shape == (2, 3)


def test_the_cascade_is_described_as_one_model(stub) -> None:
    from strata.proto.inference import grpc_service_pb2 as v2

    metadata = stub.ModelMetadata(v2.ModelMetadataRequest(name="digits-cascade"), timeout=10)
    assert [t.name for t in metadata.inputs] == ["images"]
    assert [t.name for t in metadata.outputs] == ["labels", "scores"]
    ready = stub.ModelReady(v2.ModelReadyRequest(name="digits-cascade"), timeout=10)
    assert ready.ready
