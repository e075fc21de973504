"""The load tool's KServe v2 REST side: the endpoint's URL, and JSON bodies made from v2 messages.

A run over HTTP posts to `/v2/models/NAME[/versions/V]/infer` the JSON body that carries what
a v2 gRPC ModelInferRequest carries: `{"id", "parameters", "inputs": [{"name", "datatype",
"shape", "data"}], "outputs"}`, each tensor's data one flat row-major list (BYTES as UTF-8
strings). Bodies are encoded once, before the run, and answers are read only for their
parameters (degraded, cached) and only when the run inspects them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import numpy as np

from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

SCHEME = "http"
_INFER = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
_EXAMPLE = "http://127.0.0.1:8000/v2/models/digits/infer"


def is_url(target: str) -> bool:
    """Whether `target` is an HTTP URL rather than a gRPC host:port."""
    return "://" in target


def split_url(url: str) -> tuple[str, str]:
    """(origin, path) of a v2 REST infer URL; ValueError saying what is wrong with it."""
    parts = urlsplit(url)
    if parts.scheme != SCHEME:
        raise ValueError(f"{url!r}: only plaintext {SCHEME}:// URLs are driven, e.g. {_EXAMPLE}")
    if not parts.hostname or parts.query or parts.fragment or not _INFER.fullmatch(parts.path):
        raise ValueError(f"{url!r} is not a v2 infer endpoint; give e.g. {_EXAMPLE}")
    return f"{SCHEME}://{parts.netloc}", parts.path


def model_path(model: str, version: str = "") -> str:
    """The v2 REST path of `model` (at `version`, if given): GET it for the model's metadata."""
    versioned = f"/versions/{quote(version, safe='')}" if version else ""
    return f"/v2/models/{quote(model, safe='')}{versioned}"


def infer_path(model: str, version: str = "") -> str:
    """The v2 REST path that runs `model` (at `version`, if given)."""
    return model_path(model, version) + "/infer"


def ready_path(infer: str) -> str:
    """The readiness path of the model an infer path names."""
    return infer.removesuffix("/infer") + "/ready"


def model_of(infer: str) -> str:
    """The model an infer path names."""
    found = _INFER.fullmatch(infer)
    if found is None:
        raise ValueError(f"{infer!r} is not a v2 infer path")
    return unquote(found["model"])


def json_body(message: bytes) -> bytes:
    """The v2 JSON body of a serialized ModelInferRequest (its model and version are the URL's)."""
    request = v2.ModelInferRequest.FromString(message)
    arrays = codec.request_inputs(request)
    body: dict[str, Any] = {}
    if request.id:
        body["id"] = request.id
    _add_parameters(body, request.parameters)
    body["inputs"] = [_tensor(t, arrays[t.name]) for t in request.inputs]
    if request.outputs:
        body["outputs"] = [_output(o) for o in request.outputs]
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def flags(answer: bytes) -> int:
    """1 if the answer's parameters mark it degraded, 2 if it came from the gateway's cache."""
    parameters = json.loads(answer).get("parameters") or {}
    degraded = 1 if parameters.get("strata.degraded") is True else 0
    return degraded | (2 if parameters.get("strata.cached") is True else 0)


def _tensor(tensor: v2.ModelInferRequest.InferInputTensor, array: np.ndarray) -> dict[str, Any]:
    out = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
    _add_parameters(out, tensor.parameters)
    out["data"] = _data(array)
    return out


def _output(output: v2.ModelInferRequest.InferRequestedOutputTensor) -> dict[str, Any]:
    out: dict[str, Any] = {"name": output.name}
    _add_parameters(out, output.parameters)
    return out


def _data(array: np.ndarray) -> list:
    flat = array.reshape(-1).tolist()
    if array.dtype == object:  # BYTES: JSON has no bytes; v2 sends UTF-8 text as strings
        return [item.decode() if isinstance(item, bytes) else item for item in flat]
    return flat


def _add_parameters(out: dict[str, Any], parameters: Mapping[str, v2.InferParameter]) -> None:
    if parameters:
        out["parameters"] = {key: _value(p) for key, p in parameters.items()}


def _value(parameter: v2.InferParameter) -> bool | int | float | str:
    return getattr(parameter, parameter.WhichOneof("parameter_choice") or "string_param")
