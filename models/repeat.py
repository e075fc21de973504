"""The decoupled demo model: Triton's `repeat_int32`, as one ONNX graph.

It takes Triton's tensors, IN (INT32, one value per response), DELAY (UINT32, as many) and
WAIT (UINT32, one), and answers with every response at once: OUT [k, 1] = IN and IDX [k, 1]
= 0..k-1, where k is IN's length. The `repeat` pipeline (docs/gateway.md, Decoupled) sends
row i of each as response i. DELAY and WAIT are taken and ignored: Strata computes all of a
request's responses in one run and does not pace them (Triton's repeat backend sleeps DELAY
milliseconds before each). IN and DELAY share their dimension, so the inference service
refuses a request whose lengths differ.

Built by hand with onnx.helper; `python -m models.build` writes it with the other demo
models (no training: it checks itself against numpy instead).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper

from models.onnx_export import IR_VERSION, OPSET, session
from strata.models.repository import write_npz

NAME = "repeat"
# model.yaml. WAIT's fixed shape makes the model unbatchable: each request runs alone.
CONFIG: dict[str, Any] = {"platform": "onnxruntime_onnx", "max_batch_size": 1}
CASE_LENGTHS = (1, 4, 0)


def graph() -> onnx.ModelProto:
    """OUT = IN as a column; IDX = the row numbers as a column of UINT32."""
    constants = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
        helper.make_tensor("column", TensorProto.INT64, [1], [1]),
    ]
    nodes = [
        helper.make_node("Unsqueeze", ["IN", "column"], ["OUT"]),
        helper.make_node("Shape", ["IN"], ["length"]),
        helper.make_node("Squeeze", ["length"], ["count"]),
        helper.make_node("Range", ["zero", "count", "one"], ["indices"]),
        helper.make_node("Unsqueeze", ["indices", "column"], ["rows"]),
        helper.make_node("Cast", ["rows"], ["IDX"], to=TensorProto.UINT32),
    ]
    inputs = [
        helper.make_tensor_value_info("IN", TensorProto.INT32, ["responses"]),
        helper.make_tensor_value_info("DELAY", TensorProto.UINT32, ["responses"]),
        helper.make_tensor_value_info("WAIT", TensorProto.UINT32, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUT", TensorProto.INT32, ["responses", 1]),
        helper.make_tensor_value_info("IDX", TensorProto.UINT32, ["responses", 1]),
    ]
    body = helper.make_graph(nodes, NAME, inputs, outputs, initializer=constants)
    model = helper.make_model(
        body, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return model


def case(length: int) -> dict[str, np.ndarray]:
    """A request for `length` responses, as Triton's decoupled tests send it."""
    return {
        "IN": np.arange(100, 100 + length, dtype=np.int32),
        "DELAY": np.full(length, 1000, np.uint32),
        "WAIT": np.array([500], np.uint32),
    }


def expected(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What the model must answer, by numpy."""
    length = len(inputs["IN"])
    return {
        "OUT": inputs["IN"].reshape(length, 1),
        "IDX": np.arange(length, dtype=np.uint32).reshape(length, 1),
    }


def write(out: Path) -> None:
    """`repository/repeat`: model.yaml, version 1 and its validation cases (checked against
    numpy first)."""
    model = graph()
    runner = session(model)
    names = [output.name for output in runner.get_outputs()]
    root = out / "repository" / NAME
    version = root / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.onnx").write_bytes(model.SerializeToString())
    (root / "model.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    for index, length in enumerate(CASE_LENGTHS):
        inputs = case(length)
        outputs = dict(zip(names, runner.run(names, inputs), strict=True))
        want = expected(inputs)
        for name, array in want.items():
            if outputs[name].dtype != array.dtype or not np.array_equal(outputs[name], array):
                raise AssertionError(f"{NAME}: ONNX Runtime and numpy disagree on {name}")
        arrays = {f"input.{name}": value for name, value in inputs.items()}
        arrays |= {f"output.{name}": value for name, value in outputs.items()}
        arrays |= {"atol": np.float64(0), "rtol": np.float64(0)}
        write_npz(version / "validation" / f"case_{index:03d}.npz", arrays)
