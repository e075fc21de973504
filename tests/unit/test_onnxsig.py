"""strata.models.onnxsig.read: a model's inputs and outputs read from the ONNX file itself are what
an ONNX Runtime session lists, for every demo model and for graphs that use the corners of the
format (initializers among the inputs, unnamed dimensions, scalars, sequences, strings)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from strata.models import onnxsig
from strata.models.onnxsig import TensorInfo

ROOT = Path(__file__).resolve().parents[2]
# The text models' embedding dimension is a name in the file that a session infers (384).
DEMO = [
    path
    for path in sorted((ROOT / "build" / "repository").glob("*/*/model.onnx"))
    if not path.parts[-3].startswith("minilm")
]


def by_session(path: Path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return (
        [TensorInfo.of(arg) for arg in session.get_inputs()],
        [TensorInfo.of(arg) for arg in session.get_outputs()],
    )


def corners(ir_version: int) -> onnx.ModelProto:
    """x FP32 [batch, 4] times initializer w (also listed as an input) -> y; a sequence of y;
    strings with an unnamed dimension, FP16 and a BOOL scalar passed through."""
    value = helper.make_tensor_value_info
    inputs = [
        value("x", TensorProto.FLOAT, ["batch", 4]),
        value("w", TensorProto.FLOAT, [4]),
        value("s", TensorProto.STRING, [None, 2]),
        value("h", TensorProto.FLOAT16, [3]),
        value("b", TensorProto.BOOL, []),
    ]
    outputs = [
        value("y", TensorProto.FLOAT, ["batch", 4]),
        helper.make_tensor_sequence_value_info("q", TensorProto.FLOAT, None),
        value("so", TensorProto.STRING, [None, 2]),
        value("ho", TensorProto.FLOAT16, [3]),
        value("bo", TensorProto.BOOL, []),
    ]
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["y"]),
        helper.make_node("SequenceConstruct", ["y"], ["q"]),
        *(helper.make_node("Identity", [name], [f"{name}o"]) for name in "shb"),
    ]
    weights = [numpy_helper.from_array(np.ones(4, np.float32), "w")]
    graph = helper.make_graph(nodes, "corners", inputs, outputs, weights)
    opsets = [helper.make_opsetid("", 11)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=ir_version)


@pytest.mark.parametrize("path", DEMO, ids=lambda p: f"{p.parts[-3]}-{p.parts[-2]}")
def test_a_demo_model_reads_as_a_session_lists_it(path: Path) -> None:
    assert onnxsig.read(path) == by_session(path)


@pytest.mark.parametrize("ir_version", [3, 8])
def test_the_format_s_corners_read_as_a_session_lists_them(tmp_path: Path, ir_version: int) -> None:
    path = tmp_path / "model.onnx"
    onnx.save(corners(ir_version), path)
    inputs, outputs = onnxsig.read(path)
    assert (inputs, outputs) == by_session(path)
    assert [t.name for t in inputs] == ["x", "s", "h", "b"]  # w is an initializer
    assert outputs[1].datatype == "seq(tensor(float))"
    assert inputs[0] == TensorInfo("x", "FP32", (-1, 4), ("batch", None))


def test_a_shape_the_file_leaves_out_is_inferred_by_a_session(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "unshaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [onnx.ValueInfoProto(name="y")],  # no type, no shape
    )
    path = tmp_path / "model.onnx"
    opsets = [helper.make_opsetid("", 11)]
    onnx.save(helper.make_model(graph, opset_imports=opsets, ir_version=8), path)
    assert onnxsig.read(path)[1] == [TensorInfo("y", "FP32", (2, 3), (None, None))]


@pytest.mark.parametrize(
    "content, why",
    [
        (b"", "no graph"),
        (b"not an onnx model", "wire type 6"),
        (b"\x08\x07", "no graph"),
        (b"\x3a\x05abc", "truncated"),
        (b"\x3a\x02\x58\x01", "holds a number"),
    ],
)
def test_a_file_that_is_no_model_is_refused_by_name(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "m" / "1" / "model.onnx"
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f"cannot read 1/model.onnx: .*{why}"):
        onnxsig.read(path)


def test_a_model_is_read_without_copying_its_weights_into_memory(tmp_path: Path) -> None:
    # A serving process keeps its heap rather than trims it (strata.process.allocator): a copy of an
    # 8 MB model read once at start would stay for the life of the process.
    weights = numpy_helper.from_array(np.zeros((1024, 1024), np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 1024])],
        [weights],
    )
    path = tmp_path / "model.onnx"
    onnx.save(helper.make_model(graph), path)
    assert path.stat().st_size > 4_000_000
    tracemalloc.start()
    try:
        inputs, outputs = onnxsig.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [i.name for i in inputs] == ["x"] and [o.name for o in outputs] == ["y"]
    assert peak < 100_000
