"""Toy ONNX models and repositories for the inference tests, and checks that they behave.

Other inference tests import the builders from here: a masked mean-pooling model with a
variable sequence dimension (its out-of-range token ids make ONNX Runtime fail, which poisons
a batch), and small dense models whose versions give different answers.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import yaml
from onnx import TensorProto, helper, numpy_helper

from models.onnx_export import IR_VERSION, OPSET, dense_model

VOCAB, WIDTH = 10, 4
Arrays = dict[str, np.ndarray]


def pooling_model(seed: int = 0) -> onnx.ModelProto:
    """ids INT64 [batch, seq] and mask FP32 [batch, seq] -> tokens [batch, seq, 4] (embedding
    times mask) and pooled [batch, 4] (masked mean over the sequence)."""
    table = np.random.default_rng(seed).normal(size=(VOCAB, WIDTH)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["table", "ids"], ["embedded"]),
        helper.make_node("Unsqueeze", ["mask", "two"], ["mask3"]),
        helper.make_node("Mul", ["embedded", "mask3"], ["tokens"]),
        helper.make_node("ReduceSum", ["tokens", "one"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask", "one"], ["count"], keepdims=1),
        helper.make_node("Div", ["summed", "count"], ["pooled"]),
    ]
    graph = helper.make_graph(
        nodes,
        "pooling",
        [
            helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info("tokens", TensorProto.FLOAT, ["batch", "seq", WIDTH]),
            helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["batch", WIDTH]),
        ],
        [
            numpy_helper.from_array(table, "table"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
            numpy_helper.from_array(np.array([2], np.int64), "two"),
        ],
    )
    return _finish(graph)


def dense(seed: int, features: int = 4, classes: int = 3, hidden: int = 0) -> onnx.ModelProto:
    """x FP32 [batch, features] -> y FP32 [batch, classes]; different seeds answer differently."""
    rng = np.random.default_rng(seed)
    sizes = [features, *([hidden] if hidden else []), classes]
    layers = [
        (rng.normal(size=(a, b)).astype(np.float32), rng.normal(size=b).astype(np.float32))
        for a, b in itertools.pairwise(sizes)
    ]
    return dense_model(layers, "x", "y")


def _finish(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def run(model: onnx.ModelProto, inputs: Arrays) -> Arrays:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs), strict=True))


def tokens(lengths: list[int], seed: int = 0) -> list[Arrays]:
    """One single-row pooling request per length, with valid ids and a full mask."""
    rng = np.random.default_rng(seed)
    return [
        {
            "ids": rng.integers(0, VOCAB, size=(1, n)).astype(np.int64),
            "mask": np.ones((1, n), np.float32),
        }
        for n in lengths
    ]


def write_version(
    root: Path,
    name: str,
    version: int,
    model: onnx.ModelProto | bytes,
    cases: list[Arrays] = (),
    manifest: dict[str, Any] | None = None,
    tolerance: float = 1e-5,
) -> Path:
    """Write `<root>/<name>/<version>/model.onnx` and golden cases computed from the model."""
    folder = root / name / str(version)
    (folder / "validation").mkdir(parents=True, exist_ok=True)
    raw = model if isinstance(model, bytes) else model.SerializeToString()
    (folder / "model.onnx").write_bytes(raw)
    for index, inputs in enumerate(cases):
        outputs = run(model, inputs)
        write_case(folder / "validation" / f"case_{index:03d}.npz", inputs, outputs, tolerance)
    if manifest is not None or not (root / name / "model.yaml").exists():
        write_manifest(root, name, manifest or {})
    return folder


def write_manifest(root: Path, name: str, manifest: dict[str, Any]) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": 16, **manifest}))


def write_case(path: Path, inputs: Arrays, outputs: Arrays, tolerance: float = 1e-5) -> None:
    arrays = {f"input.{k}": v for k, v in inputs.items()}
    arrays |= {f"output.{k}": v for k, v in outputs.items()}
    np.savez(path, **arrays, atol=np.float64(tolerance), rtol=np.float64(tolerance))


def test_pooling_ignores_masked_positions() -> None:
    model = pooling_model()
    (short,) = tokens([3])
    padded = {
        "ids": np.concatenate([short["ids"], np.full((1, 2), 7, np.int64)], axis=1),
        "mask": np.concatenate([short["mask"], np.zeros((1, 2), np.float32)], axis=1),
    }
    alone, with_padding = run(model, short), run(model, padded)
    np.testing.assert_allclose(alone["pooled"], with_padding["pooled"], rtol=1e-6)
    np.testing.assert_allclose(alone["tokens"], with_padding["tokens"][:, :3], rtol=1e-6)
    assert not with_padding["tokens"][:, 3:].any()


def test_dense_versions_answer_differently() -> None:
    x = {"x": np.ones((2, 4), np.float32)}
    assert not np.allclose(run(dense(1), x)["y"], run(dense(2), x)["y"])
