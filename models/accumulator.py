"""The stateful demo model: a running total over a sequence of requests.

`accumulator` adds each request's `value` to the total of the sequence's earlier requests.
The server keeps that total between requests as an implicit state (Triton's `state`): the
model takes the previous total as ACCUMULATOR_IN and returns the next as ACCUMULATOR_OUT;
START (BOOL) tells it to ignore what came in, as the first request of a sequence would. It
also echoes its control inputs, so clients can see what the server gave it: `controls`
holds START, END and READY as INT32, `corrid` the sequence id (CORRID, a string, which
takes uint64 and string ids alike).

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

NAME = "accumulator"
MAX_BATCH_SIZE = 64
# model.yaml: how the inference service drives it (strata.wire.triton_sequences.ModelSequence).
CONFIG: dict[str, Any] = {
    "platform": "onnxruntime_onnx",
    "max_batch_size": MAX_BATCH_SIZE,
    "sequence": {
        "control": {"start": "START", "end": "END", "ready": "READY", "corrid": "CORRID"},
        "state": [{"input": "ACCUMULATOR_IN", "output": "ACCUMULATOR_OUT"}],
        "max_sequence_idle_microseconds": 5_000_000,
        "max_sequences": 256,
    },
}


def graph() -> onnx.ModelProto:
    """total = value + (0 if START else ACCUMULATOR_IN), per row."""

    def tensor(name: str, kind: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, kind, ["batch", 1])

    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    nodes = [
        helper.make_node("Where", ["START", "zero", "ACCUMULATOR_IN"], ["before"]),
        helper.make_node("Add", ["value", "before"], ["sum"]),
        helper.make_node("Identity", ["sum"], ["total"]),
        helper.make_node("Identity", ["sum"], ["ACCUMULATOR_OUT"]),
        helper.make_node("Cast", ["START"], ["start_int"], to=TensorProto.INT32),
        helper.make_node("Concat", ["start_int", "END", "READY"], ["controls"], axis=1),
        helper.make_node("Identity", ["CORRID"], ["corrid"]),
    ]
    inputs = [
        tensor("value", TensorProto.FLOAT),
        tensor("ACCUMULATOR_IN", TensorProto.FLOAT),
        tensor("START", TensorProto.BOOL),
        tensor("END", TensorProto.INT32),
        tensor("READY", TensorProto.INT32),
        tensor("CORRID", TensorProto.STRING),
    ]
    outputs = [
        tensor("total", TensorProto.FLOAT),
        tensor("ACCUMULATOR_OUT", TensorProto.FLOAT),
        helper.make_tensor_value_info("controls", TensorProto.INT32, ["batch", 3]),
        tensor("corrid", TensorProto.STRING),
    ]
    body = helper.make_graph(nodes, NAME, inputs, outputs, initializer=[zero])
    model = helper.make_model(
        body, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION
    )
    onnx.checker.check_model(model)
    return model


def case(rows: int, start: bool) -> dict[str, np.ndarray]:
    """Inputs of `rows` sequences' requests, the server's part filled in as it would."""
    column = np.arange(1, rows + 1, dtype=np.float32).reshape(rows, 1)
    return {
        "value": column,
        "ACCUMULATOR_IN": column * 10,
        "START": np.full((rows, 1), start),
        "END": np.zeros((rows, 1), np.int32),
        "READY": np.ones((rows, 1), np.int32),
        "CORRID": np.array([[f"seq-{row}"] for row in range(rows)]),
    }


def expected(inputs: dict[str, np.ndarray]) -> np.ndarray:
    """What the model must answer as `total`, by numpy."""
    return inputs["value"] + np.where(inputs["START"], 0, inputs["ACCUMULATOR_IN"])


def write(out: Path) -> None:
    """`repository/accumulator`: model.yaml, version 1 and its validation cases (checked
    against numpy first)."""
    model = graph()
    runner = session(model)
    names = [output.name for output in runner.get_outputs()]
    root = out / "repository" / NAME
    version = root / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.onnx").write_bytes(model.SerializeToString())
    (root / "model.yaml").write_text(yaml.safe_dump(CONFIG, sort_keys=False))
    for index, (rows, start) in enumerate([(1, True), (4, False)]):
        inputs = case(rows, start)
        outputs = dict(zip(names, runner.run(names, inputs), strict=True))
        if not np.array_equal(outputs["total"], expected(inputs)):
            raise AssertionError(f"{NAME}: ONNX Runtime and numpy disagree on {inputs}")
        arrays = {f"input.{name}": value for name, value in inputs.items()}
        arrays |= {  # strings as numpy's own: a case file holds no Python objects
            f"output.{name}": value.astype(str) if value.dtype == object else value
            for name, value in outputs.items()
        }
        arrays |= {"atol": np.float64(0), "rtol": np.float64(0)}  # sums of small integers
        write_npz(version / "validation" / f"case_{index:03d}.npz", arrays)
