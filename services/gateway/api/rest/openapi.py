"""The OpenAPI document of the REST API (served at /openapi.json): the KServe v2 protocol's
REST endpoints as published, the binary tensor extension, Triton's statistics extension, and
the statuses Strata answers with."""

from __future__ import annotations

from typing import Any

from strata import __version__

DATATYPES = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip
_ERRORS = {
    "400": "Malformed request, or a pipeline that cannot answer it as sent.",
    "401": "No valid API key, where keys are required; for a control call, no valid admin "
    "token (authorization: Bearer).",
    "403": "Not allowed: forcing an arm (strata.arm) without the force_arm capability, or a "
    "control call where the server has no admin token.",
    "404": "No such model (pipeline) or version, or shared memory region or object.",
    "409": "A shared memory region of that name is registered already.",
    "413": "The body is larger than gateway.rest.max_body_bytes.",
    "429": "Rate limit or overload: retry after Retry-After seconds (retry-after-ms).",
    "500": "A bug, or a pipeline that does not fit its model (the deployment's to mend): the "
    "server log has the details.",
    "501": "Not offered by this server; the message names the alternative.",
    "503": "No healthy upstream can answer now, or a model is not loaded or ready; or what "
    "was asked needs what this deployment lacks (FAILED_PRECONDITION: the message says).",
    "504": "The deadline (x-strata-timeout-ms) passed.",
}
_MODEL_ERRORS = ("401", "404")
MODEL_TRACE = "/v2/models/{name}/trace/setting"
_STATISTICS = "Counts and durations."


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _errors(*codes: str) -> dict[str, Any]:
    return {code: _json(_ref("Error"), _ERRORS[code]) for code in codes}


def _answers(schema: str, description: str, *errors: str) -> dict[str, Any]:
    """The responses of a GET: `schema` with 200, then the error statuses `errors`."""
    return {"200": _json(_ref(schema), description), **_errors(*errors)}


def _readiness(schema: str, *errors: str) -> dict[str, Any]:
    """The responses of a readiness GET: `schema` with 200 (ready) and 400 (not ready)."""
    return {
        "200": _json(_ref(schema), "Ready."),
        "400": _json(_ref(schema), "Not ready."),
        **_errors(*errors),
    }


def _get(
    summary: str, responses: dict[str, Any], parameters: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """A path item with one GET operation."""
    operation: dict[str, Any] = {"summary": summary}
    if parameters is not None:
        operation["parameters"] = parameters
    return {"get": {**operation, "responses": responses}}


def _parameters(pipelines: list[str], versioned: bool) -> list[dict[str, Any]]:
    name = {"type": "string", "minLength": 1}
    if pipelines:
        name["examples"] = pipelines
    out = [{"name": "name", "in": "path", "required": True, "schema": name}]
    if versioned:
        out.append(
            {
                "name": "version",
                "in": "path",
                "required": True,
                "schema": {"type": "string", "minLength": 1, "examples": ["1"]},
            }
        )
    return out


def _model_paths(pipelines: list[str], versioned: bool) -> dict[str, Any]:
    base = "/v2/models/{name}" + ("/versions/{version}" if versioned else "")
    parameters = _parameters(pipelines, versioned)
    infer = {
        "summary": "Run the pipeline on the request's tensors.",
        "parameters": [
            *parameters,
            {
                "name": "Inference-Header-Content-Length",
                "in": "header",
                "required": False,
                "description": "Binary tensor extension: the JSON header's length in bytes; "
                "the binary tensors follow it.",
                "schema": {"type": "integer", "minimum": 0},
            },
            {
                "name": "x-strata-timeout-ms",
                "in": "header",
                "required": False,
                "description": "The caller's deadline in milliseconds (default: the gateway's).",
                "schema": {"type": "number", "exclusiveMinimum": 0},
            },
        ],
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _ref("InferenceRequest")}},
        },
        "responses": {
            "200": {
                "description": "The outputs (binary data after the JSON header where asked).",
                "content": {
                    "application/json": {"schema": _ref("InferenceResponse")},
                    "application/octet-stream": {},
                },
            },
            **_errors("400", "401", "403", "404", "413", "429", "500", "503", "504"),
        },
    }
    return {
        base: _get(
            "The pipeline's metadata: its inputs and outputs.",
            _answers("ModelMetadata", "The model's metadata.", *_MODEL_ERRORS),
            parameters,
        ),
        base + "/config": _get(
            "The pipeline's model configuration, as Triton's (max_batch_size, input formats).",
            _answers("ModelConfig", "The model's configuration.", *_MODEL_ERRORS),
            parameters,
        ),
        base + "/ready": _get(
            "Whether the pipeline can answer now (200) or not (400).",
            _readiness("ModelReady", *_MODEL_ERRORS),
            parameters,
        ),
        base + "/stats": _get(
            "The pipeline's statistics (Triton's statistics extension).",
            _answers("Statistics", _STATISTICS, *_MODEL_ERRORS),
            parameters,
        ),
        base + "/infer": {"post": infer},
    }


def _post(
    summary: str,
    body: dict[str, Any],
    responses: dict[str, Any],
    parameters: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A path item with one POST operation whose JSON body (`body`) is optional."""
    operation: dict[str, Any] = {"summary": summary}
    if parameters is not None:
        operation["parameters"] = parameters
    content = {"application/json": {"schema": body}}
    body_spec = {"required": False, "content": content}
    return {"post": {**operation, "requestBody": body_spec, "responses": responses}}


def _repository_paths(pipelines: list[str]) -> dict[str, Any]:
    """Triton's model repository extension, each call with the admin token."""
    name = _parameters(pipelines, versioned=False)
    done = _answers("Empty", "Done.", "400", "401", "403", "404", "429", "503", "504")
    return {
        "/v2/repository/index": _post(
            "Every pipeline, with the model version behind each arm and its state.",
            {"type": "object", "properties": {"ready": {"type": "boolean"}}},
            _answers("RepositoryIndex", "The index.", "400", "401", "403", "429"),
        ),
        "/v2/repository/models/{name}/load": _post(
            "Load (or reload) the pipeline's model on every inference deployment behind it.",
            {"type": "object", "properties": {"parameters": {"type": "object"}}},
            done,
            name,
        ),
        "/v2/repository/models/{name}/unload": _post(
            "Unload the pipeline's model on every inference deployment behind it.",
            {"type": "object", "properties": {"parameters": {"type": "object"}}},
            done,
            name,
        ),
    }


# The CUDA routes a gateway without GPU memory answers truthfully: it holds no regions.
EMPTY_CUDA = {
    "/v2/cudasharedmemory/status": "No CUDA regions: the gateway holds none.",
    "/v2/cudasharedmemory/unregister": "Unregister every CUDA region (there are none).",
}


def _shared_memory_paths() -> dict[str, Any]:
    """Triton's system shared memory extension (each client's own regions), and the CUDA
    one's routes: status and unregister of all regions answer as an empty registry, the
    others 501 naming the alternative."""
    region = [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}]
    status = _answers("SharedMemoryStatus", "The client's regions.", "401", "403", "404")
    done = _answers("Empty", "Done.", "400", "401", "403", "404", "409", "429")
    register = {
        "type": "object",
        "required": ["key", "byte_size"],
        "properties": {
            "key": {"type": "string"},
            "offset": {"type": "integer", "minimum": 0},
            "byte_size": {"type": "integer", "minimum": 1},
        },
    }
    nothing = {"type": "object"}
    paths = {
        "/v2/systemsharedmemory/status": _get("This client's regions.", status),
        "/v2/systemsharedmemory/region/{name}/status": _get("One region.", status, region),
        "/v2/systemsharedmemory/region/{name}/register": _post(
            "Register a region of a shared memory object on the gateway's host.",
            register,
            done,
            region,
        ),
        "/v2/systemsharedmemory/unregister": _post("Unregister every region.", nothing, done),
        "/v2/systemsharedmemory/region/{name}/unregister": _post(
            "Unregister one region.", nothing, done, region
        ),
    }
    for path, item in list(paths.items()):
        method, operation = next(iter(item.items()))
        cuda = path.replace("systemsharedmemory", "cudasharedmemory")
        if cuda in EMPTY_CUDA:
            paths[cuda] = {method: {**operation, "summary": EMPTY_CUDA[cuda]}}
            continue
        unoffered = {**operation, "summary": "Not offered: use system shared memory."}
        paths[cuda] = {method: {**unoffered, "responses": _answers("Empty", "Never.", "501")}}
    return paths


def _settings_paths(pipelines: list[str]) -> dict[str, Any]:
    """Triton's logging and trace extensions (changes need the admin token)."""
    changes = {"type": "object"}
    logging = _answers("LogSettings", "The log settings.", "400", "401", "403", "429")
    trace = _answers(
        "TraceSettings", "The trace settings.", "400", "401", "403", "404", "429", "503"
    )
    name = _parameters(pipelines, versioned=False)
    paths = {"/v2/logging": {**_get("The gateway's log settings.", logging)}}
    paths["/v2/logging"].update(_post("Change the log level (admin token).", changes, logging))
    for path, parameters in (("/v2/trace/setting", None), (MODEL_TRACE, name)):
        paths[path] = {
            **_get("The trace settings (the server's).", trace, parameters),
            **_post(
                "Change trace_rate and trace_level (admin token); the server's path only.",
                changes,
                trace,
                parameters,
            ),
        }
    return paths


def _schemas() -> dict[str, Any]:
    parameters = {
        "type": "object",
        "additionalProperties": {"type": ["string", "number", "integer", "boolean"]},
    }
    shape = {"type": "array", "items": {"type": "integer", "minimum": 0}}
    tensor = {
        "name": {"type": "string"},
        "datatype": {"type": "string", "enum": DATATYPES},
        "shape": shape,
    }
    data = {"description": "Values, flat or nested, row-major.", "type": "array"}
    return {
        "Error": {
            "type": "object",
            "required": ["error"],
            "properties": {"error": {"type": "string"}},
        },
        "Parameters": parameters,
        "RequestInput": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {**tensor, "parameters": parameters, "data": data},
        },
        "RequestOutput": {
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"type": "string"}, "parameters": parameters},
        },
        "InferenceRequest": {
            "type": "object",
            "required": ["inputs"],
            "properties": {
                "id": {"type": "string"},
                "parameters": parameters,
                "inputs": {"type": "array", "items": _ref("RequestInput")},
                "outputs": {"type": "array", "items": _ref("RequestOutput")},
            },
        },
        "ResponseOutput": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {**tensor, "parameters": parameters, "data": data},
        },
        "InferenceResponse": {
            "type": "object",
            "required": ["model_name", "outputs"],
            "properties": {
                "model_name": {"type": "string"},
                "model_version": {"type": "string"},
                "id": {"type": "string"},
                "parameters": parameters,
                "outputs": {"type": "array", "items": _ref("ResponseOutput")},
            },
        },
        "MetadataTensor": {
            "type": "object",
            "required": ["name", "datatype", "shape"],
            "properties": {**tensor, "shape": {"type": "array", "items": {"type": "integer"}}},
        },
        "ModelMetadata": {
            "type": "object",
            "required": ["name", "platform", "inputs", "outputs"],
            "properties": {
                "name": {"type": "string"},
                "versions": {"type": "array", "items": {"type": "string"}},
                "platform": {"type": "string"},
                "inputs": {"type": "array", "items": _ref("MetadataTensor")},
                "outputs": {"type": "array", "items": _ref("MetadataTensor")},
            },
        },
        "ModelConfig": {
            "type": "object",
            "required": ["name", "max_batch_size", "input", "output"],
            "properties": {
                "name": {"type": "string"},
                "platform": {"type": "string"},
                "max_batch_size": {"type": "integer", "minimum": 0},
                "input": {"type": "array", "items": {"type": "object"}},
                "output": {"type": "array", "items": {"type": "object"}},
            },
        },
        "Empty": {"type": "object", "maxProperties": 0},
        "LogSettings": {
            "type": "object",
            "properties": {
                "log_file": {"type": "string"},
                "log_info": {"type": "boolean"},
                "log_warning": {"type": "boolean"},
                "log_error": {"type": "boolean"},
                "log_verbose_level": {"type": "integer", "minimum": 0},
                "log_format": {"type": "string"},
            },
        },
        "TraceSettings": {
            "type": "object",
            "additionalProperties": {"type": ["string", "array"]},
        },
        "SharedMemoryStatus": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "key", "offset", "byte_size"],
                "properties": {
                    "name": {"type": "string"},
                    "key": {"type": "string"},
                    "offset": {"type": "integer"},
                    "byte_size": {"type": "integer"},
                },
            },
        },
        "RepositoryIndex": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "version", "state"],
                "properties": {
                    "name": {"type": "string"},
                    "version": {"type": "string"},
                    "state": {"type": "string"},
                    "reason": {"type": "string"},
                },
            },
        },
        "ServerMetadata": {
            "type": "object",
            "required": ["name", "version", "extensions"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "string"},
                "extensions": {"type": "array", "items": {"type": "string"}},
            },
        },
        "Live": {
            "type": "object",
            "required": ["live"],
            "properties": {"live": {"type": "boolean"}},
        },
        "Ready": {
            "type": "object",
            "required": ["ready"],
            "properties": {"ready": {"type": "boolean"}},
        },
        "ModelReady": {
            "type": "object",
            "required": ["name", "ready"],
            "properties": {"name": {"type": "string"}, "ready": {"type": "boolean"}},
        },
        "Statistics": {"type": "object", "properties": {"model_stats": {"type": "array"}}},
    }


def document(pipelines: list[str]) -> dict[str, Any]:
    """The OpenAPI 3.1 document, the configured pipelines given as examples of model names."""
    paths: dict[str, Any] = {
        "/v2/health/live": _get("Whether the server is live.", _answers("Live", "Live.")),
        "/v2/health/ready": _get(
            "Whether every layer can answer (200) or not (400).", _readiness("Ready")
        ),
        "/v2": _get(
            "The server's name, version and extensions.",
            _answers("ServerMetadata", "Server metadata."),
        ),
        "/v2/models/stats": _get(
            "Every pipeline's statistics.", _answers("Statistics", _STATISTICS, "401")
        ),
    }
    for versioned in (False, True):
        paths.update(_model_paths(pipelines, versioned))
    paths.update(_repository_paths(pipelines))
    paths.update(_shared_memory_paths())
    paths.update(_settings_paths(pipelines))
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Strata: KServe v2 inference protocol (REST)",
            "version": __version__,
            "description": "Pipelines are the models: each request goes through preprocess, "
            'inference and postprocess. Errors are {"error": message}.',
        },
        "paths": paths,
        "components": {"schemas": _schemas()},
    }
