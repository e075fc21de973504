"""The messages a run sends: from JSON (ghz's `-d`/`-D`), a binary message, or a data set.

JSON is the method's request message in protobuf's JSON mapping (a list of them is sent in
turn). Arrays (an .npz file, or a demo data set under build/data) are cut into requests of
`--batch` rows, each input named and typed as the model's metadata declares. Over HTTP the
JSON (`-d`/`-D`) is the v2 REST body itself and `-B` a body file, both sent as they are;
arrays become v2 JSON bodies, typed by the model's REST metadata.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path

import grpc
import numpy as np
from google.protobuf import json_format, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message

from bench.load import codes, rest
from bench.load.options import Options, UsageError
from bench.load.transport import blocking_channel
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec

DATASETS = Path(__file__).resolve().parents[2] / "build" / "data"
MAX_MESSAGES = 4096  # distinct requests prepared from a data set; they are sent in turn


def method(path: str) -> MethodDescriptor:
    """The unary v2 method a gRPC path names."""
    service_name, _, method_name = path.strip("/").partition("/")
    package, _, service = service_name.rpartition(".")
    descriptor = v2.DESCRIPTOR.services_by_name.get(service)
    if descriptor is None or package != v2.DESCRIPTOR.package:
        known = ", ".join(f"{v2.DESCRIPTOR.package}.{s}" for s in v2.DESCRIPTOR.services_by_name)
        raise UsageError(f"unknown service {service_name!r}; this tool speaks {known}")
    found = descriptor.methods_by_name.get(method_name)
    if found is None:
        names = ", ".join(descriptor.methods_by_name)
        raise UsageError(f"{service_name} has no method {method_name!r}; methods: {names}")
    if found.client_streaming or found.server_streaming:
        raise UsageError(f"{method_name} streams; only unary methods can be driven")
    return found


def messages(options: Options) -> list[bytes]:
    """Serialized request messages for the run (HTTP: JSON bodies), in the order they are sent."""
    if options.http:
        return _bodies(options)
    descriptor = method(options.call)
    cls = message_factory.GetMessageClass(descriptor.input_type)
    if options.data is not None:
        return from_json(cls, options.data, "-d/--data")
    if options.binary_file is not None:
        return [from_binary(cls, options.binary_file)]
    if options.data_file is not None and options.data_file.suffix != ".npz":
        return from_json(cls, _read(options.data_file), str(options.data_file))
    _require_infer(descriptor)
    model = options.model or options.dataset
    if not model:
        raise UsageError("--model names the model (pipeline) the .npz inputs are for")
    return _from_data(options, model, model_inputs)


def _bodies(options: Options) -> list[bytes]:
    """HTTP: the JSON given (-d, -D) or the body file (-B) as they are; arrays as v2 JSON."""
    if options.data is not None:
        return json_bodies(options.data, "-d/--data")
    if options.binary_file is not None:
        return [_read_bytes(options.binary_file)]
    if options.data_file is not None and options.data_file.suffix != ".npz":
        return json_bodies(_read(options.data_file), str(options.data_file))
    model = options.model or rest.model_of(options.call)
    return [rest.json_body(m) for m in _from_data(options, model, http_inputs)]


def _from_data(
    options: Options, model: str, inputs_of: Callable[[Options, str], dict[str, str]]
) -> list[bytes]:
    """Requests made from the data set or .npz file, typed as `inputs_of` reads the model."""
    path = options.data_file or dataset_path(options.dataset or "")
    return from_arrays(model, load_arrays(path, inputs_of(options, model)), options.batch)


def json_bodies(text: str, where: str) -> list[bytes]:
    """v2 REST bodies from JSON text: one object, or a list of them sent in turn."""
    value = _json(text, where)
    items = value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, dict) for item in items):
        raise UsageError(f"{where} must hold a v2 request body (a JSON object) or a list of them")
    return [json.dumps(item, separators=(",", ":")).encode() for item in items]


def from_json(cls: type[Message], text: str, where: str) -> list[bytes]:
    value = _json(text, where)
    items = value if isinstance(value, list) else [value]
    if not items:
        raise UsageError(f"{where} holds an empty list of messages")
    out = []
    for item in items:
        try:
            out.append(json_format.ParseDict(item, cls()).SerializeToString())
        except json_format.ParseError as exc:
            raise UsageError(f"{where} is not a {cls.DESCRIPTOR.full_name}: {exc}") from None
    return out


def from_binary(cls: type[Message], path: Path) -> bytes:
    data = _read_bytes(path)
    try:
        cls.FromString(data)
    except DecodeError as exc:
        raise UsageError(f"{path} is not a serialized {cls.DESCRIPTOR.full_name}: {exc}") from None
    return data


def dataset_path(name: str) -> Path:
    path = DATASETS / f"{name}_test.npz"
    if not path.is_file():
        known = sorted(p.name.removesuffix("_test.npz") for p in DATASETS.glob("*_test.npz"))
        raise UsageError(
            f"no data set {name!r} under {DATASETS} (have: {', '.join(known) or 'none'}); "
            "`make models` builds them"
        )
    return path


def model_inputs(options: Options, model: str) -> dict[str, str]:
    """The model's inputs and their datatypes, from its v2 ModelMetadata."""
    request = v2.ModelMetadataRequest(name=model)
    host, timeout = options.host, options.connect_timeout
    with blocking_channel(host, options.tls) as channel:
        try:
            reply = v2_grpc.GRPCInferenceServiceStub(channel).ModelMetadata(
                request,
                timeout=timeout,
                wait_for_ready=True,
                metadata=tuple(options.metadata.items()),
            )
        except grpc.RpcError as exc:
            if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise ConnectionError(
                    f"cannot connect to {host} within {timeout:g}s ({exc.code().name}); "
                    "is the server running there?"
                ) from None
            raise UsageError(
                f"cannot read model {model!r}'s inputs from {host}: "
                f"{exc.code().name}: {exc.details()}"
            ) from None
    return {tensor.name: tensor.datatype for tensor in reply.inputs}


def http_inputs(options: Options, model: str) -> dict[str, str]:
    """The model's inputs and their datatypes, from its v2 REST metadata (GET /v2/models/NAME)."""
    url = options.host + rest.model_path(model)
    request = urllib.request.Request(url, headers=options.metadata)
    try:
        with urllib.request.urlopen(request, timeout=options.connect_timeout) as answer:
            metadata = json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        why = codes.http_error(exc.code, exc.read())
        raise UsageError(f"cannot read model {model!r}'s inputs from {url}: {why}") from None
    except OSError as exc:  # refused, unreachable, timed out (URLError is an OSError)
        raise ConnectionError(
            f"cannot connect to {options.host} within {options.connect_timeout:g}s "
            f"({getattr(exc, 'reason', exc)}); is the server running there?"
        ) from None
    return {tensor["name"]: tensor["datatype"] for tensor in metadata.get("inputs", [])}


def load_arrays(path: Path, inputs: Mapping[str, str]) -> dict[str, np.ndarray]:
    """The arrays of `path` the model takes, cast to its datatypes."""
    with np.load(path, allow_pickle=False) as npz:
        missing = sorted(set(inputs) - set(npz.files))
        if missing:
            raise UsageError(
                f"{path} has no array {missing[0]!r} (it has {', '.join(npz.files)}); "
                f"the model's inputs are {', '.join(inputs)}"
            )
        return {name: _cast(name, npz[name], datatype) for name, datatype in inputs.items()}


def from_arrays(
    model: str,
    arrays: Mapping[str, np.ndarray],
    batch: int = 1,
    parameters: Mapping[str, str] | None = None,
) -> list[bytes]:
    """Requests of `batch` consecutive rows each, wrapping around, for every row at least once."""
    rows = {len(a) for a in arrays.values()}
    if len(rows) != 1 or 0 in rows:
        raise UsageError(f"inputs disagree on their number of rows: {sorted(rows)}")
    (count,) = rows
    out = []
    for start in range(0, min(count, MAX_MESSAGES * batch), batch):
        index = np.arange(start, start + batch) % count
        request = codec.build_request(model, {k: v[index] for k, v in arrays.items()})
        for key, value in (parameters or {}).items():
            request.parameters[key].string_param = value
        out.append(request.SerializeToString())
    return out


def describe(options: Options) -> object:
    """What the report's options.data says about the data sent."""
    if options.data is not None:
        return json.loads(options.data)
    source = options.data_file or options.binary_file or f"dataset {options.dataset}"
    return {
        "source": str(source),
        "model": options.model or options.dataset,
        "batch": options.batch,
    }


def _require_infer(descriptor: MethodDescriptor) -> None:
    if descriptor.name != "ModelInfer":
        raise UsageError(
            f"data sets and .npz files make ModelInfer requests; give -d JSON for {descriptor.name}"
        )


def _cast(name: str, array: np.ndarray, datatype: str) -> np.ndarray:
    dtype = codec.DTYPES.get(datatype)
    if dtype is None:
        raise UsageError(f"input {name!r} has datatype {datatype!r}, which has no numpy type")
    return array if datatype == "BYTES" else array.astype(dtype)


def _json(text: str, where: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{where} is not JSON: {exc}") from None


def _read_bytes(path: Path) -> bytes:
    if not Path(path).is_file():
        raise UsageError(f"-B/--binary-file {path} does not exist")
    return Path(path).read_bytes()


def _read(path: Path) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None
