"""The v2 REST routes: each one a thin adapter from HTTP to the pipelines and back."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeGuard

import orjson
from google.protobuf import json_format
from google.protobuf.message import Message
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from services.gateway.api.repository import Repository
from services.gateway.api.rest import openapi, tensors
from services.gateway.api.rest.scan import check_json
from services.gateway.api.rest.statuses import JSON, TooLarge, error_response, json_response
from services.gateway.api.server_settings import ServerSettings
from services.gateway.door.caller import PRINCIPAL
from services.gateway.request import Caller
from services.gateway.serving.pipelines import Pipelines
from services.gateway.serving.shared_memory import CUDA_HINT, no_cuda_regions
from strata.config.gateway import Rest
from strata.config.pipelines import TensorSpec
from strata.errors import InvalidArgument, Unavailable, Unimplemented, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.shapes.schema import check_datatype
from strata.telemetry.metrics import RPC_DURATION, RPCS
from strata.telemetry.tracing import server_span

TIMEOUT_HEADER = "x-strata-timeout-ms"  # the caller's deadline, as gRPC's timeout would be
MODEL = "/v2/models/{name}"
VERSION = MODEL + "/versions/{version}"
REPOSITORY = "/v2/repository"
SHM = "/v2/systemsharedmemory"
CUDA = "/v2/cudasharedmemory"
STOPPED = "the gateway stopped before answering (its grace after SIGTERM ended); retry elsewhere"
MAX_BODY = "gateway.rest.max_body_bytes"  # the setting that raises the body limit
Handler = Callable[[Request], Awaitable[Response]]


def build_app(
    pipelines: Pipelines, repository: Repository, settings: ServerSettings, limits: Rest
) -> Starlette:
    """The REST API over `pipelines`, model `repository` control and the server's log and
    trace `settings`, with request bodies held to `limits`."""
    api = _Api(pipelines, repository, settings, limits)
    routes = [
        ("GET", "/v2/health/live", api.live),
        ("GET", "/v2/health/ready", api.ready),
        ("GET", "/v2", api.server_metadata),
        ("GET", "/v2/models/stats", api.statistics),
        ("GET", "/openapi.json", api.openapi),
        ("POST", REPOSITORY + "/index", api.repository_index),
        ("POST", REPOSITORY + "/models/{name}/load", api.load),
        ("POST", REPOSITORY + "/models/{name}/unload", api.unload),
        ("GET", SHM + "/status", api.shm_status),
        ("GET", SHM + "/region/{name}/status", api.shm_status),
        ("POST", SHM + "/region/{name}/register", api.shm_register),
        ("POST", SHM + "/unregister", api.shm_unregister),
        ("POST", SHM + "/region/{name}/unregister", api.shm_unregister),
        ("GET", "/v2/logging", api.logging),
        ("POST", "/v2/logging", api.logging),
        ("GET", "/v2/trace/setting", api.trace),
        ("POST", "/v2/trace/setting", api.trace),
        ("GET", MODEL + "/trace/setting", api.trace),
        ("POST", MODEL + "/trace/setting", api.trace),
        ("GET", CUDA + "/status", api.cuda_status),
        ("GET", CUDA + "/region/{name}/status", api.cuda_status),
        ("POST", CUDA + "/region/{name}/register", api.cuda),
        ("POST", CUDA + "/unregister", api.cuda_unregister),
        ("POST", CUDA + "/region/{name}/unregister", api.cuda_unregister),
    ]
    for prefix in (MODEL, VERSION):
        routes += [
            ("GET", prefix, api.metadata),
            ("GET", prefix + "/config", api.config),
            ("GET", prefix + "/ready", api.model_ready),
            ("GET", prefix + "/stats", api.statistics),
            ("POST", prefix + "/infer", api.infer),
        ]
    return Starlette(
        exception_handlers={HTTPException: _no_route},
        routes=[
            Route(path, _served(f"{method} {path}", handler), methods=[method])
            for method, path, handler in routes
        ],
    )


async def _no_route(request: Request, exc: Exception) -> Response:
    """A path or method the API does not have, answered as the protocol's error."""
    assert isinstance(exc, HTTPException)  # the class it handles; Starlette types it wider
    message = f"{request.method} {shown(request.url.path)}: {exc.detail}"
    return json_response({"error": message}, exc.status_code, exc.headers)


def _served(method: str, handler: Handler) -> Handler:
    """`handler` in a server span of the caller's trace (W3C headers), counted and timed as
    gRPC methods are, and with any failure answered as the protocol's error."""
    duration = RPC_DURATION.labels(method)

    async def served(request: Request) -> Response:
        started = time.perf_counter()
        code = "OK"
        with server_span(method, _headers(request)) as span:
            try:
                response = await handler(request)
            except asyncio.CancelledError:
                # uvicorn cancels what still runs once the grace after SIGTERM is over, and
                # answers a cancelled request with a bare 500: it is told to go elsewhere.
                _uncancel()
                response, status = error_response(Unavailable(STOPPED), method)
                code = status.name
            except Exception as exc:  # every failure must reach the caller as a status
                response, status = error_response(exc, method)
                code = status.name
            if span.is_recording():
                span.set_attribute("http.response.status_code", response.status_code)
        RPCS.labels(method, code).inc()
        duration.observe(time.perf_counter() - started)
        return response

    return served


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()


class _Api:
    def __init__(
        self, pipelines: Pipelines, repository: Repository, settings: ServerSettings, limits: Rest
    ) -> None:
        self._pipelines = pipelines
        self._repository = repository
        self._settings = settings
        self._limits = limits
        self._openapi = orjson.dumps(openapi.document(pipelines.names()))

    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        ready = await self._pipelines.server_ready()
        return json_response({"ready": ready}, 200 if ready else 400)

    async def server_metadata(self, request: Request) -> Response:
        metadata = self._pipelines.server_metadata()
        return json_response(
            {
                "name": metadata.name,
                "version": metadata.version,
                "extensions": list(metadata.extensions),
            }
        )

    async def openapi(self, request: Request) -> Response:
        return Response(self._openapi, media_type=JSON)

    async def metadata(self, request: Request) -> Response:
        name, version = self._model(request)
        metadata = self._pipelines.model_metadata(name, version)
        return json_response(
            {
                "name": metadata.name,
                "versions": list(metadata.versions),
                "platform": metadata.platform,
                "inputs": [_tensor(t) for t in metadata.inputs],
                "outputs": [_tensor(t) for t in metadata.outputs],
            }
        )

    async def config(self, request: Request) -> Response:
        """Triton's model configuration, as its REST API answers it (the config itself)."""
        name, version = self._model(request)
        return json_response(_config(self._pipelines.model_config(name, version).config))

    async def model_ready(self, request: Request) -> Response:
        name, version = self._model(request)
        self._pipelines.pipeline(name, version)  # NOT_FOUND for no such pipeline
        ready = await self._pipelines.model_ready(name, version)
        return json_response({"name": name, "ready": ready}, 200 if ready else 400)

    async def statistics(self, request: Request) -> Response:
        name, version = self._model(request)
        return json_response(_plain(self._pipelines.model_statistics(name, version)))

    async def infer(self, request: Request) -> Response:
        with self._pipelines.counted(request.path_params.get("name", ""), "rest") as count:
            caller, parsed = await self._parse(request)
            answer = count.answered(await self._pipelines.answer(parsed.request, caller))
        content, header_length = tensors.to_body(answer, parsed)
        if header_length is None:
            return Response(content, media_type=JSON)
        return Response(
            content,
            media_type="application/octet-stream",
            headers={tensors.HEADER_LENGTH: str(header_length)},
        )

    async def repository_index(self, request: Request) -> Response:
        """Triton's repository index: a list of {name, version, state, reason}."""
        caller = _caller(request)
        ready = (await self._json_body(request)).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgument("`ready` must be a boolean")
        index = await self._repository.index(caller, ready)
        return json_response([_index_entry(entry) for entry in index.models])

    async def load(self, request: Request) -> Response:
        caller = _caller(request)
        parameters = (await self._json_body(request)).get("parameters")
        await self._repository.load(caller, request.path_params["name"], parameters)
        return json_response({})

    async def unload(self, request: Request) -> Response:
        caller = _caller(request)
        await self._json_body(request)  # unload_dependents: a pipeline has none
        await self._repository.unload(caller, request.path_params["name"])
        return json_response({})

    async def shm_status(self, request: Request) -> Response:
        """Triton's region status: a list of {name, key, offset, byte_size}."""
        client = self._pipelines.identify(_caller(request))
        name = request.path_params.get("name", "")
        regions = self._pipelines.memory.status(client, name)
        return json_response(
            [
                {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for r in regions
            ]
        )

    async def shm_register(self, request: Request) -> Response:
        client = self._pipelines.identify(_caller(request))
        body = await self._json_body(request)
        key = body.get("key")
        offset, size = body.get("offset", 0), body.get("byte_size")
        if not isinstance(key, str) or not _natural(offset) or not _natural(size):
            raise InvalidArgument(
                "a region needs `key` (a string), `byte_size` and optionally `offset` "
                "(non-negative integers)"
            )
        self._pipelines.memory.register(client, request.path_params["name"], key, offset, size)
        return json_response({})

    async def shm_unregister(self, request: Request) -> Response:
        client = self._pipelines.identify(_caller(request))
        self._pipelines.memory.unregister(client, request.path_params.get("name", ""))
        return json_response({})

    async def logging(self, request: Request) -> Response:
        """Triton's log settings: read (GET), or changed (POST, admin token)."""
        caller = _caller(request)
        self._pipelines.identify(caller)
        changes = await self._json_body(request) if request.method == "POST" else {}
        return json_response(self._settings.set_log(caller, changes))

    async def trace(self, request: Request) -> Response:
        """Triton's trace settings, as its REST API writes them (lists for trace_level)."""
        caller = _caller(request)
        self._pipelines.identify(caller)
        changes = await self._json_body(request) if request.method == "POST" else {}
        model = request.path_params.get("name", "")
        settings = self._settings.set_trace(caller, model, changes)
        return json_response(
            {key: v if key == "trace_level" else v[0] for key, v in settings.items()}
        )

    async def cuda_status(self, request: Request) -> Response:
        """No CUDA regions: `[]` for all of them (services/gateway/serving/shared_memory.py)."""
        self._no_cuda_region(request)
        return json_response([])

    async def cuda_unregister(self, request: Request) -> Response:
        """Every CUDA region unregistered: there are none."""
        self._no_cuda_region(request)
        return json_response({})

    async def cuda(self, request: Request) -> Response:
        raise Unimplemented(f"{request.method} {shown(request.url.path)}: {CUDA_HINT}")

    def _no_cuda_region(self, request: Request) -> None:
        self._pipelines.identify(_caller(request))
        name = request.path_params.get("name", "")
        no_cuda_regions(name, f"{request.method} {shown(request.url.path)}")

    async def _json_body(self, request: Request) -> dict[str, Any]:
        """A small call's JSON body (none: an empty object), held to the body limits."""
        limits = self._limits
        body = await _body(request, limits.max_body_bytes)
        if not body.strip():
            return {}
        check_json(body, limits.max_json_depth, limits.max_json_values)
        return tensors.parse(body, "a JSON object")

    async def _parse(self, request: Request) -> tuple[Caller, tensors.Parsed]:
        """The caller and its request as a v2 message, the cheapest refusals first: an unknown
        caller sends no body, nor does a request for no such pipeline."""
        caller = _caller(request)
        name, version = self._model(request, caller)
        pipeline = self._pipelines.pipeline(name, version)
        limits = self._limits
        body = await _body(request, limits.max_body_bytes)
        header, binary = tensors.split(body, _header_length(request))
        check_json(header, limits.max_json_depth, limits.max_json_values)
        document = tensors.parse(header)
        _check_datatypes(document.get("inputs"), pipeline.inputs)
        return caller, tensors.to_request(document, binary, name, version)

    def _model(self, request: Request, caller: Caller | None = None) -> tuple[str, str]:
        """The path's model and version; the caller identified first (API keys)."""
        self._pipelines.identify(caller or _caller(request))
        params = request.path_params
        return params.get("name", ""), params.get("version", "")


def _check_datatypes(inputs: object, specs: Sequence[TensorSpec]) -> None:
    """Each JSON input's datatype against the pipeline's before its values are read as that
    type, so a wrong type is refused as one (as over gRPC), not as a value out of range."""
    declared = {spec.name: spec for spec in specs}
    for item in inputs if isinstance(inputs, list) else ():
        if not isinstance(item, dict):
            continue  # tensors.to_request says what is wrong with it
        name, datatype = item.get("name"), item.get("datatype")
        spec = declared.get(name) if isinstance(name, str) else None  # a list is unhashable
        if spec is not None and isinstance(datatype, str):
            check_datatype(spec, datatype)


def _headers(request: Request) -> dict[str, str]:
    return {
        key.decode("latin-1"): value.decode("latin-1") for key, value in request.scope["headers"]
    }


def _caller(request: Request) -> Caller:
    """The REST caller as admission sees a gRPC one: headers as metadata, gRPC's peer form."""
    headers = _headers(request)
    host, port = request.scope.get("client") or ("unknown", 0)
    peer = f"ipv6:[{host}]:{port}" if ":" in host else f"ipv4:{host}:{port}"
    principal = request.scope.get("extensions", {}).get(PRINCIPAL, {}).get("name")
    return Caller(headers, peer, _timeout(headers.get(TIMEOUT_HEADER)), "rest", principal)


def _timeout(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        milliseconds = float(value)
    except ValueError:
        milliseconds = -1
    if not 0 < milliseconds < float("inf"):
        raise InvalidArgument(f"{TIMEOUT_HEADER} must be a positive number of milliseconds")
    return milliseconds / 1000


async def _body(request: Request, limit: int) -> bytes:
    """The body, refused (413) once it passes `limit` bytes, before any more is read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"the body is {declared} bytes, more than the limit of {limit} ({MAX_BODY})")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"the body is more than the limit of {limit} bytes ({MAX_BODY})")
        chunks.append(chunk)
    return b"".join(chunks)


def _header_length(request: Request) -> int | None:
    value = request.headers.get(tensors.HEADER_LENGTH)
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise InvalidArgument(f"{tensors.HEADER_LENGTH} must be a non-negative integer")
    return int(value)


def _tensor(tensor: v2.ModelMetadataResponse.TensorMetadata) -> dict[str, object]:
    return {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}


def _config(config: Message) -> dict[str, Any]:
    """A model config as Triton writes it: enums by name, every field, dims as numbers."""
    out = json_format.MessageToDict(
        config, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    for tensor in [*out.get("input", []), *out.get("output", [])]:
        tensor["dims"] = [int(d) for d in tensor["dims"]]
    return out


def _natural(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _index_entry(entry: v2.RepositoryIndexResponse.ModelIndex) -> dict[str, str]:
    out = {"name": entry.name, "version": entry.version, "state": entry.state}
    return out | ({"reason": entry.reason} if entry.reason else {})


def _plain(message: Message) -> Any:
    """A message as JSON values, 64-bit integers as numbers (protobuf's JSON writes them as
    strings), as Triton's statistics extension answers."""
    out = {}
    for field in message.DESCRIPTOR.fields:
        value = getattr(message, field.name)
        if field.label == field.LABEL_REPEATED:
            out[field.name] = [_plain(v) if isinstance(v, Message) else v for v in value]
        else:
            out[field.name] = _plain(value) if isinstance(value, Message) else value
    return out
