"""A stateful model's `sequence:` section (model.yaml) checked against its ONNX graph when a
version loads: the control inputs and the implicit state must be tensors the graph has, of
types and shapes the server can feed (services/inference/sequences.py feeds them)."""

from __future__ import annotations

from services.inference.signature import Signature
from strata.errors import InvalidArgument
from strata.models.onnxsig import TensorInfo
from strata.wire.triton_sequences import ModelSequence

FLAG_TYPES = {"BOOL", "INT32", "FP32"}  # Triton's bool_, int32_ and fp32_false_true
CORRID_TYPES = {"UINT64", "INT64", "UINT32", "INT32", "BYTES"}


def check_model(signature: Signature, sequence: ModelSequence | None) -> None:
    """InvalidArgument unless the model's `sequence:` fits its graph: every control and state
    input is an input of a datatype it can take, every state output an output of the same
    datatype and shape as its input, and each takes one row (a request of a sequence is one)."""
    if sequence is None:
        return
    inputs = {t.name: t for t in signature.inputs}
    outputs = {t.name: t for t in signature.outputs}
    where = f"model {signature.model!r} sequence"
    for kind, name in sequence.control.named().items():
        info = _named(inputs, name, f"{where}.control.{kind.lower()}", "input")
        allowed = CORRID_TYPES if kind == "CORRID" else FLAG_TYPES
        if info.datatype not in allowed:
            raise InvalidArgument(
                f"{where}: {kind} input {name!r} is {info.datatype}, not one of {sorted(allowed)}"
            )
    for state in sequence.state:
        given = _named(inputs, state.input, f"{where}.state", "input")
        kept = _named(outputs, state.output, f"{where}.state", "output")
        if given.datatype != kept.datatype or row_shape(given) != row_shape(kept):
            raise InvalidArgument(
                f"{where}: state {state.output!r} ({kept.datatype} {list(kept.shape)}) must "
                f"match input {state.input!r} ({given.datatype} {list(given.shape)})"
            )
        if -1 in row_shape(given)[1:]:
            raise InvalidArgument(
                f"{where}: state input {state.input!r} needs fixed dimensions after the "
                f"first, got {list(given.shape)}"
            )


def _named(tensors: dict[str, TensorInfo], name: str, where: str, what: str) -> TensorInfo:
    if name not in tensors:
        raise InvalidArgument(
            f"{where} names {name!r}, which is no {what} of the graph ({sorted(tensors)})"
        )
    return tensors[name]


def row_shape(info: TensorInfo) -> list[int]:
    """The shape of one request's tensor: an open first dimension is its one row."""
    return [1 if i == 0 and d == -1 else d for i, d in enumerate(info.shape)]
