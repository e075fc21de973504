"""v2 REST bodies to and from v2 messages: JSON tensors (`data` flat or nested, row-major)
and the binary tensor extension (a JSON header of `Inference-Header-Content-Length` bytes,
then each binary tensor's bytes in order, sized by its `binary_data_size`).

A request becomes the same ModelInferRequest a gRPC client would send, every tensor as raw
contents, so both protocols share one path through the gateway and give the same bytes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from services.gateway.serving.shared_memory import REGION
from strata.errors import InvalidArgument, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec
from strata.wire.limits import check_declared

BINARY_SIZE = "binary_data_size"
BINARY_OUTPUT = "binary_data_output"  # request parameter: every output as binary data
BINARY = "binary_data"  # output parameter: this output as binary data (or not)
HEADER_LENGTH = "inference-header-content-length"
# Which JSON values (as parsed) each numpy kind takes: no bool among numbers, no number as
# text, no float in an integer tensor.
_JSON_TYPES = {
    "b": frozenset({bool}),
    "O": frozenset({str}),
    "i": frozenset({int}),
    "u": frozenset({int}),
    "f": frozenset({int, float}),
}
_PARAMETER_FIELDS = {bool: "bool_param", int: "int64_param", float: "double_param"}


@dataclass
class Parsed:
    """A REST inference request as a v2 message, and how the client wants each output."""

    request: v2.ModelInferRequest
    binary: dict[str, bool]  # output name -> as binary data; absent: `binary_default`
    binary_default: bool


def split(body: bytes, header_length: int | None) -> tuple[bytes, bytes]:
    """The JSON header and the binary data after it."""
    if header_length is None:
        return body, b""
    if header_length > len(body):
        raise InvalidArgument(
            f"{HEADER_LENGTH} is {header_length}, but the body has {len(body)} bytes"
        )
    return body[:header_length], body[header_length:]


def parse(header: bytes, expected: str = "a JSON object with `inputs`") -> dict[str, Any]:
    """The JSON header as an object (its size and depth already checked); refused, saying
    what was `expected`, if it is anything else."""
    try:
        document = orjson.loads(header)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgument(f"the request is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise InvalidArgument(f"the request must be {expected}")
    return document


def to_request(document: Mapping[str, Any], binary: bytes, model: str, version: str) -> Parsed:
    """The v2 message of a parsed REST inference request."""
    request = v2.ModelInferRequest(
        model_name=model, model_version=version, id=_string(document, "id", "the request")
    )
    parameters = _object(document, "parameters", "the request")
    _set_parameters(request.parameters, parameters, "the request")
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise InvalidArgument("the request needs `inputs`, a non-empty list of tensors")
    offset = 0
    for item in inputs:
        offset = _add_input(request, item, binary, offset)
    if offset != len(binary):
        raise InvalidArgument(
            f"{len(binary) - offset} bytes of binary data follow the tensors' "
            f"{BINARY_SIZE}s ({offset} bytes)"
        )
    binary_default = parameters.get(BINARY_OUTPUT) is True
    return Parsed(request, _add_outputs(request, document.get("outputs")), binary_default)


def _add_input(request: v2.ModelInferRequest, item: Any, binary: bytes, offset: int) -> int:
    """Append one input tensor; the offset of the next one's binary data."""
    if not isinstance(item, dict):
        raise InvalidArgument("each of `inputs` must be an object: name, datatype, shape, data")
    name = _string(item, "name", "an input", required=True)
    where = f"input {shown(name)}"
    datatype = _string(item, "datatype", where, required=True)
    shape = _shape(item.get("shape"), where)
    parameters = _object(item, "parameters", where)
    size = parameters.get(BINARY_SIZE)
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    if REGION in parameters:
        if "data" in item or size is not None:
            raise InvalidArgument(f"{where} is in shared memory: it has no `data` nor binary data")
        _set_parameters(tensor.parameters, parameters, where)
        return offset
    if size is None:
        request.raw_input_contents.append(_json_tensor(name, datatype, shape, item.get("data")))
        return offset
    if "data" in item:
        raise InvalidArgument(f"{where} has both `data` and {BINARY_SIZE}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise InvalidArgument(f"{where}: {BINARY_SIZE} must be a non-negative integer")
    if offset + size > len(binary):
        raise InvalidArgument(
            f"{where}: {BINARY_SIZE} is {size}, but only {len(binary) - offset} bytes of "
            "binary data are left"
        )
    request.raw_input_contents.append(binary[offset : offset + size])
    return offset + size


def _json_tensor(name: str, datatype: str, shape: list[int], data: Any) -> bytes:
    """A tensor's JSON `data` as the raw bytes gRPC would carry."""
    count = check_declared(name, datatype, shape, None)
    if not isinstance(data, list):
        raise InvalidArgument(
            f"input {shown(name)} needs `data`, a list of values (or binary data)"
        )
    try:  # as Python objects, so no value is converted before its type is checked
        values = np.array(data, dtype=object).reshape(-1).tolist()
    except ValueError:
        values = [data]  # ragged in a way numpy refuses outright: a list among values
    kinds = set(map(type, values))
    if list in kinds:
        raise InvalidArgument(f"input {shown(name)}: `data` must be nested evenly, or flat")
    if len(values) != count:
        raise InvalidArgument(
            f"input {shown(name)}: shape {shape} needs {count} values, got {len(values)} in `data`"
        )
    if not kinds <= _JSON_TYPES[codec.DTYPES[datatype].kind]:
        raise InvalidArgument(f"input {shown(name)}: `data` holds a value that is not {datatype}")
    if datatype == "BYTES":
        return codec.encode_bytes(values)
    return _numbers(values, name, datatype).tobytes()


def _numbers(values: list[object], name: str, datatype: str) -> np.ndarray:
    """`values` as `datatype`, refused where a value does not fit it."""
    dtype = codec.DTYPES[datatype]
    try:
        with np.errstate(over="ignore"):
            converted = np.array(values, dtype=dtype)
    except OverflowError:  # an integer outside the datatype's range
        converted = None
    if converted is None or (dtype.kind == "f" and not np.isfinite(converted).all()):
        raise InvalidArgument(f"input {shown(name)}: a value is out of range for {datatype}")
    return converted


def _add_outputs(request: v2.ModelInferRequest, outputs: Any) -> dict[str, bool]:
    """Name the requested outputs; how each wants its data (binary or JSON), where it says."""
    if outputs is None:
        return {}
    if not isinstance(outputs, list):
        raise InvalidArgument("`outputs` must be a list of objects with a name")
    binary: dict[str, bool] = {}
    for item in outputs:
        if not isinstance(item, dict):
            raise InvalidArgument("each of `outputs` must be an object with a name")
        name = _string(item, "name", "an output", required=True)
        parameters = _object(item, "parameters", f"output {shown(name)}")
        output = request.outputs.add(name=name)
        _set_parameters(output.parameters, parameters, f"output {shown(name)}")
        if isinstance(parameters.get(BINARY), bool):
            binary[name] = parameters[BINARY]
    return binary


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(size, int) and not isinstance(size, bool) for size in value
    ):
        raise InvalidArgument(f"{where} needs `shape`, a list of integers")
    negative = next((axis for axis, size in enumerate(value) if size < 0), None)
    if negative is not None:
        raise InvalidArgument(f"{where}: dimension {negative} of its shape is negative")
    return value


def _string(item: Mapping[str, Any], key: str, where: str, required: bool = False) -> str:
    value = item.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise InvalidArgument(f"{where} needs `{key}`, a string")
    return value


def _object(item: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = item.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgument(f"{where}: `{key}` must be an object")
    return value


def _set_parameters(target: Any, parameters: Mapping[str, Any], where: str) -> None:
    for key, value in parameters.items():
        if key in (BINARY_OUTPUT,):
            continue
        if isinstance(value, str):
            target[key].string_param = value
        elif isinstance(value, bool | int | float) and math.isfinite(value):
            field = _PARAMETER_FIELDS[type(value)]
            try:
                setattr(target[key], field, value)
            except ValueError:  # an integer beyond int64
                raise InvalidArgument(f"{where}: parameter {shown(key)} is out of range") from None
        else:
            raise InvalidArgument(
                f"{where}: parameter {shown(key)} must be a string, a number or a boolean"
            )


def parameters_of(parameters: Mapping[str, v2.InferParameter]) -> dict[str, Any]:
    """v2 message parameters as JSON values."""
    return {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in parameters.items()
        if value.WhichOneof("parameter_choice")
    }


def to_body(response: v2.ModelInferResponse, parsed: Parsed) -> tuple[bytes, int | None]:
    """The REST answer: its bytes, and the JSON header's length when binary data follows."""
    outputs, chunks = [], []
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True):
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if REGION in tensor.parameters:
            entry["parameters"] = parameters_of(tensor.parameters)
        elif parsed.binary.get(tensor.name, parsed.binary_default):
            entry["parameters"] = {BINARY_SIZE: len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_values(tensor, raw)
        outputs.append(entry)
    header = orjson.dumps(
        {
            "model_name": response.model_name,
            "model_version": response.model_version,
            "id": response.id,
            "parameters": parameters_of(response.parameters),
            "outputs": outputs,
        },
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    if not chunks:
        return header, None
    return header + b"".join(chunks), len(header)


def _json_values(tensor: v2.ModelInferResponse.InferOutputTensor, raw: bytes) -> Any:
    """A tensor's values as a flat JSON list (a numpy array orjson writes as one)."""
    values = codec.from_raw(tensor.name, tensor.datatype, [math.prod(tensor.shape)], raw)
    if tensor.datatype != "BYTES":
        return values
    try:
        return [item.decode() for item in values]
    except UnicodeDecodeError:
        raise InvalidArgument(
            f"output {tensor.name!r} holds bytes that are not UTF-8; ask for it with "
            f'"parameters": {{"{BINARY}": true}}'
        ) from None
