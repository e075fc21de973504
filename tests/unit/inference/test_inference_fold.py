"""A pipeline's normalize and layout folded into its model: the same JPEG gives the same
logits and top 5 through today's path (FP32 CHW from preprocess) and the folded one (UINT8
HWC from preprocess, the tail inside the model's graph)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from bench.images import STEPS, photo_jpeg
from models.onnx_export import IR_VERSION, OPSET
from services.inference.manifest import read_spec
from services.inference.model import ModelVersion, load_version
from services.preprocess.pipeline import build_pipeline
from strata.config.inference import InferenceSettings
from strata.config.pipelines import Pipeline
from strata.errors import NotReady
from strata.shapes.folding import folds
from tests.unit.inference.test_inference_toymodels import write_version

CLASSES = 1000


def small_cnn() -> onnx.ModelProto:
    """[N, 3, 224, 224] FP32 -> a strided 3x3 convolution, ReLU, global pooling, 1,000
    logits: a vision model's shape in little arithmetic."""
    rng = np.random.default_rng(3)
    weights = {
        "w": rng.normal(size=(16, 3, 3, 3)).astype(np.float32) * 0.2,
        "dense": rng.normal(size=(16, CLASSES)).astype(np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["image", "w"], ["conv"], strides=[2, 2], pads=[1] * 4),
            helper.make_node("Relu", ["conv"], ["relu"]),
            helper.make_node("GlobalAveragePool", ["relu"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "dense"], ["logits"]),
        ],
        "cnn",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )


def images_pipeline() -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, CLASSES]}],
            "preprocess": [{"kind": kind, **options} for kind, options in STEPS],
            "model": {"name": "cnn"},
        }
    )


def load(root: Path, folded: bool) -> ModelVersion:
    spec = read_spec(root / "cnn" / "model.yaml", InferenceSettings(models=["cnn"], workers=1))
    tail = folds({"images": images_pipeline()})["images"] if folded else None
    folder = root / "cnn" / "1"
    return load_version(folder, "cnn", 1, spec, ThreadPoolExecutor(1), "t", tail)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repository")
    case = {"image": np.random.default_rng(4).normal(size=(1, 3, 224, 224)).astype(np.float32)}
    write_version(root, "cnn", 1, small_cnn(), [case], {"max_batch_size": 8})
    return root


def test_the_same_jpeg_gives_the_same_logits_and_top_5_folded(repository: Path) -> None:
    spec = images_pipeline()
    (tail,) = folds({"images": spec}).values()
    photos = np.array([photo_jpeg(), photo_jpeg(480, 640), photo_jpeg(300, 200)], dtype=object)
    today = build_pipeline("images", spec, repository)
    short = build_pipeline("images", spec, repository, folded=tail.steps)
    pixels = today.run({"image": photos[:1]})["image"]
    crops = short.run({"image": photos[:1]})["image"]
    assert (pixels.dtype, pixels.shape) == (np.float32, (1, 3, 224, 224))
    assert (crops.dtype, crops.shape) == (np.uint8, (1, 224, 224, 3))  # a quarter the bytes
    unfolded, folded = load(repository, folded=False), load(repository, folded=True)
    assert [(t.name, t.datatype, t.shape) for t in folded.signature.inputs] == [
        ("image", "UINT8", (-1, 224, 224, 3))
    ]
    for photo in photos:
        one = np.array([photo], dtype=object)
        expected = unfolded.run(today.run({"image": one}))["logits"]
        got = folded.run(short.run({"image": one}))["logits"]
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
        assert (np.argsort(-got[0])[:5] == np.argsort(-expected[0])[:5]).all()
    batch = short.run({"image": photos[:1].repeat(4)})
    answers = folded.run_requests([batch, short.run({"image": photos[1:2]})])
    assert answers[0]["logits"].shape == (4, CLASSES)


def test_a_model_without_the_input_the_tail_feeds_is_refused_naming_it(tmp_path: Path) -> None:
    model = small_cnn()
    model.graph.input[0].name = "pixels"
    model.graph.node[0].input[0] = "pixels"
    write_version(tmp_path, "cnn", 1, model.SerializeToString(), [], {"max_batch_size": 8})
    with pytest.raises(NotReady, match="has no input 'image', which the pipeline's tail feeds"):
        load(tmp_path, folded=True)
