"""A model version's inputs and outputs as its ONNX graph declares them.

The inference service serves them; preprocess and postprocess read them at start to check
that a pipeline's steps and rules fit the model they surround (strata.shapes.wiring). Those two read
them from the file's protobuf fields (`read`): the import of onnxruntime and a session per
model version cost each of them 0.14 s of CPU at start (the default config's four versions)
only to learn what the file says; reading the file costs 0.005 s. One difference remains: a
dimension the file names (an exporter's `Divembedding_dim_1`) where ONNX Runtime infers a
number (384) stays open here; the wiring check compares datatypes and ranks, which the file
gives exactly.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple, Protocol, cast

ORT_TYPES = {
    "tensor(bool)": "BOOL",
    "tensor(uint8)": "UINT8",
    "tensor(uint16)": "UINT16",
    "tensor(uint32)": "UINT32",
    "tensor(uint64)": "UINT64",
    "tensor(int8)": "INT8",
    "tensor(int16)": "INT16",
    "tensor(int32)": "INT32",
    "tensor(int64)": "INT64",
    "tensor(float16)": "FP16",
    "tensor(float)": "FP32",
    "tensor(double)": "FP64",
    "tensor(string)": "BYTES",
}


class Arg(Protocol):
    """A graph input or output as ONNX Runtime describes it (its NodeArg)."""

    name: str
    type: str
    shape: list[int | str | None]


@dataclass(frozen=True)
class TensorInfo:
    """A graph input or output; -1 marks an open dimension, `dims` holds symbolic names."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    dims: tuple[str | None, ...]

    @classmethod
    def of(cls, arg: Arg) -> TensorInfo:
        """From an ONNX Runtime graph input or output (or one read from the file)."""
        shape = tuple(d if isinstance(d, int) and d > 0 else -1 for d in arg.shape)
        dims = tuple(d if isinstance(d, str) and d else None for d in arg.shape)
        return cls(arg.name, ORT_TYPES.get(arg.type, arg.type), shape, dims)


def read(path: Path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs of the ONNX model at `path` as ONNX Runtime lists them (inputs
    that are initializers left out), read from the file; only where it leaves a type or a
    shape to be inferred is a session opened. ValueError if it cannot be read."""
    try:
        graph = _graph(_mapped(path))
        initialized = {_name(tensor) for tensor in graph.get(_INITIALIZER, [])}
        inputs = [
            _arg(value) for value in graph.get(_INPUT, []) if _name(value, 1) not in initialized
        ]
        outputs = [_arg(value) for value in graph.get(_OUTPUT, [])]
    except (OSError, _Malformed) as exc:
        why = exc.strerror if isinstance(exc, OSError) else str(exc)
        raise ValueError(f"cannot read {path.parent.name}/{path.name}: {why}") from None
    if any(arg.shape is None or arg.type == _UNDEFINED for arg in (*inputs, *outputs)):
        return _inferred(path)
    # every shape is known past the check above
    return [TensorInfo.of(cast(Arg, arg)) for arg in inputs], [
        TensorInfo.of(cast(Arg, arg)) for arg in outputs
    ]


def _mapped(path: Path) -> bytes | mmap.mmap:
    """The file's bytes, mapped rather than read: a model of many MB then leaves no copy in
    the heap, which a serving process keeps rather than hands back (strata.process.allocator)."""
    with path.open("rb") as file:
        if not os.fstat(file.fileno()).st_size:
            return b""  # mmap refuses an empty file; the parse says what is wrong with it
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def _inferred(path: Path) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """The inputs and outputs ONNX Runtime infers: the graph opened unoptimised on one
    thread and let go at once."""
    import onnxruntime as ort  # here, not above: most models never need it

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ONNX Runtime raises its own exception types for bad files
        first = (str(exc).strip() or type(exc).__name__).splitlines()[0][:300]
        raise ValueError(f"cannot read {path.parent.name}/{path.name}: {first}") from None
    return (
        [TensorInfo.of(arg) for arg in session.get_inputs()],
        [TensorInfo.of(arg) for arg in session.get_outputs()],
    )


# The fields of onnx.proto read here (ModelProto.graph; GraphProto's initializers, inputs and
# outputs; ValueInfoProto, TypeProto and TensorShapeProto), by field number.
_GRAPH = 7
_INITIALIZER, _INPUT, _OUTPUT = 5, 11, 12
_TENSOR_NAME = 8
_TENSOR, _SEQUENCE, _MAP, _SPARSE, _OPTIONAL = 1, 4, 5, 8, 9
_UNDEFINED = "undefined"
# TensorProto.DataType, by number, as ONNX Runtime names it in "tensor(...)".
_ELEMENTS = (
    *("undefined", "float", "uint8", "int8", "uint16", "int16", "int32", "int64", "string"),
    *("bool", "float16", "double", "uint32", "uint64", "complex64", "complex128", "bfloat16"),
    *("float8e4m3fn", "float8e4m3fnuz", "float8e5m2", "float8e5m2fnuz", "uint4", "int4"),
    "float4e2m1",
)


class _Malformed(Exception):
    """The bytes are not a protobuf message of the shape onnx.proto gives them."""


# A message's fields by number: a varint or fixed-width field's values as ints, a
# length-delimited one's as memoryviews.
_Fields = dict[int, list[int | memoryview]]


class _Read(NamedTuple):
    """A graph input or output read from the file, shaped as ONNX Runtime's NodeArg (shape
    None: a tensor whose shape the file leaves to be inferred)."""

    name: str
    type: str
    shape: list[int | str | None] | None


def _graph(model: bytes | mmap.mmap) -> _Fields:
    graphs = _fields(memoryview(model)).get(_GRAPH)
    if not graphs:
        raise _Malformed("not an ONNX model (no graph)")
    return _fields(graphs[-1])


def _name(message: int | memoryview, number: int = _TENSOR_NAME) -> str:
    """A TensorProto's name (or, by `number`, another message's)."""
    return _text(_fields(message), number)


def _arg(value: int | memoryview) -> _Read:
    """A ValueInfoProto (name 1, type 2) as a NodeArg shows it."""
    fields = _fields(value)
    kinds = _fields(fields[2][-1]) if 2 in fields else {}
    shape: list[int | str | None] | None = []
    if _TENSOR in kinds:
        tensor = _fields(kinds[_TENSOR][-1])
        # TensorShapeProto (2): its dims (1)
        shape = [_dim(dim) for dim in _fields(tensor[2][-1]).get(1, [])] if 2 in tensor else None
    return _Read(_text(fields, 1), _type(kinds), shape)


def _dim(dim: int | memoryview) -> int | str | None:
    """A TensorShapeProto.Dimension: its value (1), else its symbolic name (2), else None."""
    fields = _fields(dim)
    if 1 in fields:
        value = _number(fields, 1)
        return value - (1 << 64) if value >= 1 << 63 else value  # int64 on the wire
    return _text(fields, 2) or None


def _type(kinds: _Fields) -> str:
    """A TypeProto as ONNX Runtime writes it: tensor(float), seq(tensor(int64)), ..."""
    if _TENSOR in kinds:
        return f"tensor({_element(_fields(kinds[_TENSOR][-1]), 1)})"
    if _SPARSE in kinds:
        return f"sparse_tensor({_element(_fields(kinds[_SPARSE][-1]), 1)})"
    if _SEQUENCE in kinds:
        return f"seq({_inner(_fields(kinds[_SEQUENCE][-1]), 1)})"
    if _OPTIONAL in kinds:
        return f"optional({_inner(_fields(kinds[_OPTIONAL][-1]), 1)})"
    if _MAP in kinds:
        fields = _fields(kinds[_MAP][-1])
        return f"map({_element(fields, 1)},{_inner(fields, 2)})"
    return _UNDEFINED


def _element(fields: _Fields, number: int) -> str:
    """A TensorProto.DataType field's name."""
    value = _number(fields, number)
    return _ELEMENTS[value] if value < len(_ELEMENTS) else f"unknown({value})"


def _inner(fields: _Fields, number: int) -> str:
    """A TypeProto field's type."""
    return _type(_fields(fields[number][-1])) if number in fields else _UNDEFINED


def _number(fields: _Fields, number: int) -> int:
    value = fields.get(number, [0])[-1]
    if not isinstance(value, int):
        raise _Malformed(f"field {number} is not a number")
    return value


def _text(fields: _Fields, number: int) -> str:
    value = fields.get(number, [b""])[-1]
    if not isinstance(value, int):
        try:
            return str(value, "utf-8")
        except UnicodeDecodeError:
            pass
    raise _Malformed(f"field {number} is not text")


def _fields(message: memoryview | int) -> _Fields:
    """A message's fields by number, each a list of its values in order: an int for a
    varint or fixed-width field, a memoryview (no copy) for a length-delimited one."""
    if not isinstance(message, memoryview):
        raise _Malformed("a message field holds a number")
    out: _Fields = {}
    for number, value in _wire(message):
        out.setdefault(number, []).append(value)
    return out


def _wire(data: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    at, end = 0, len(data)
    while at < end:
        key, at = _varint(data, at)
        number, kind = key >> 3, key & 7
        if number == 0:
            raise _Malformed("field number 0")
        value: int | memoryview
        if kind == 0:
            value, at = _varint(data, at)
        elif kind in (1, 2, 5):
            size, at = _varint(data, at) if kind == 2 else (8 if kind == 1 else 4, at)
            if at + size > end:
                raise _Malformed("truncated")
            value = (
                data[at : at + size]
                if kind == 2
                else int.from_bytes(data[at : at + size], "little")
            )
            at += size
        else:
            raise _Malformed(f"wire type {kind} is not protobuf's")
        yield number, value


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while at < len(data) and shift < 70:
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7
    raise _Malformed("truncated")
