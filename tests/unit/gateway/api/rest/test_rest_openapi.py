"""The OpenAPI document: valid OpenAPI 3.1, every `$ref` resolving, every route the app
serves described (and nothing else), and the bodies the gateway really sends matching it."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import jsonschema
import jsonschema_rs
import numpy as np
import orjson
import pytest
import schemathesis

from services.gateway.api.rest import openapi, tensors
from services.gateway.api.rest.app import build_app
from services.gateway.api.rest.statuses import error_response
from strata.config.gateway import Rest
from strata.errors import NotFound
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

# Starlette answers HEAD for every GET, and the document's own address is, as usual, not in it.
UNDOCUMENTED = {"HEAD"}
SELF = ("GET", "/openapi.json")
METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


class FakePipelines:
    def names(self) -> list[str]:
        return ["digits"]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    return openapi.document(["digits"])


def operations(document: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in document["paths"].items():
        for method, operation in item.items():
            if method in METHODS:
                yield method.upper(), path, operation


def refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from refs(value)


def resolve(document: dict[str, Any], ref: str) -> Any:
    assert ref.startswith("#/"), ref
    node: Any = document
    for part in ref[2:].split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


@pytest.mark.slow  # a schema validation
def test_the_document_is_valid_openapi_3_1(document) -> None:
    assert document["openapi"] == "3.1.0"
    schemathesis.openapi.from_dict(document).validate()


def test_the_validator_refuses_a_broken_document() -> None:
    broken = openapi.document(["digits"])
    broken["paths"]["/v2"]["get"]["responses"] = {"200": {"content": {}}}
    with pytest.raises(jsonschema_rs.ValidationError):
        schemathesis.openapi.from_dict(broken).validate()


def test_every_ref_resolves(document) -> None:
    found = set(refs(document))
    assert len(found) > 5
    for ref in found:
        assert isinstance(resolve(document, ref), dict), ref


@pytest.mark.parametrize("name", list(openapi.document([])["components"]["schemas"]))
def test_every_component_is_a_valid_json_schema(document, name: str) -> None:
    jsonschema.Draft202012Validator.check_schema(document["components"]["schemas"][name])


def test_the_document_describes_every_route_the_app_serves(document) -> None:
    app = build_app(FakePipelines(), None, None, Rest())
    served = {
        (method, route.path)
        for route in app.routes
        for method in route.methods
        if method not in UNDOCUMENTED
    }
    described = {(method, path) for method, path, _ in operations(document)}
    assert SELF in served
    assert described == served - {SELF}


def test_schemathesis_sees_every_described_operation(document) -> None:
    loaded = schemathesis.openapi.from_dict(openapi.document(["digits"]))
    seen = {(op.ok().method.upper(), op.ok().path) for op in loaded.get_all_operations()}
    assert seen == {(method, path) for method, path, _ in operations(document)}


def test_every_path_parameter_is_declared_and_required(document) -> None:
    for method, path, operation in operations(document):
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"{(\w+)}", path)), (method, path)
        assert all(p["required"] for p in operation.get("parameters", []) if p["in"] == "path")


def test_every_operation_documents_a_success_response(document) -> None:
    for method, path, operation in operations(document):
        assert "200" in operation["responses"], (method, path)


def test_pipelines_are_the_examples_of_model_names() -> None:
    name = openapi.document(["digits", "tabular"])["paths"]["/v2/models/{name}"]["get"]
    assert name["parameters"][0]["schema"]["examples"] == ["digits", "tabular"]
    bare = openapi.document([])["paths"]["/v2/models/{name}"]["get"]
    assert "examples" not in bare["parameters"][0]["schema"]


def test_infer_documents_the_binary_tensor_extension(document) -> None:
    infer = document["paths"]["/v2/models/{name}/infer"]["post"]
    headers = {p["name"] for p in infer["parameters"] if p["in"] == "header"}
    assert "Inference-Header-Content-Length" in headers
    assert "application/octet-stream" in infer["responses"]["200"]["content"]
    assert {"400", "413", "429", "503", "504"} <= set(infer["responses"])


def test_the_app_serves_the_document_at_openapi_json(document) -> None:
    status, body = asyncio.run(get(build_app(FakePipelines(), None, None, Rest()), "/openapi.json"))
    assert status == 200
    assert orjson.loads(body) == document


async def get(app: Any, path: str) -> tuple[int, bytes]:
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "headers": [],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    await app(scope, receive, send)
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return sent[0]["status"], body


def conforms(document: dict[str, Any], name: str, instance: Any) -> None:
    schema = {"$ref": f"#/components/schemas/{name}", "components": document["components"]}
    jsonschema.Draft202012Validator(schema).validate(instance)


def answer() -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name="digits", model_version="1", id="r")
    response.parameters["strata.arm"].string_param = "a"
    response.parameters["strata.level"].int64_param = 1
    response.parameters["strata.degraded"].bool_param = False
    outputs = {
        "labels": np.array([[b"7", b"1"]], dtype=object),
        "scores": np.array([[0.75, 0.25]], dtype=np.float32),
    }
    codec.add_outputs(response, outputs)
    return response


@pytest.mark.parametrize("binary", [False, True])
def test_inference_answers_match_the_response_schema(document, binary: bool) -> None:
    content, length = tensors.to_body(answer(), tensors.Parsed(v2.ModelInferRequest(), {}, binary))
    conforms(document, "InferenceResponse", orjson.loads(content[:length]))


def test_a_request_the_gateway_takes_matches_the_request_schema(document) -> None:
    request = {
        "id": "r",
        "parameters": {"binary_data_output": True, "strata.arm": "a"},
        "inputs": [
            {"name": "images", "datatype": "UINT8", "shape": [1, 2], "data": [[0, 255]]},
            {
                "name": "text",
                "datatype": "BYTES",
                "shape": [1],
                "parameters": {"binary_data_size": 5},
            },
        ],
        "outputs": [{"name": "labels", "parameters": {"binary_data": False}}],
    }
    tensors.to_request(request, codec.encode_bytes([b"a"]), "digits", "")
    conforms(document, "InferenceRequest", request)


def test_the_schema_refuses_what_the_gateway_refuses(document) -> None:
    negative = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [-1], "data": []}]}
    with pytest.raises(jsonschema.ValidationError):
        conforms(document, "InferenceRequest", negative)


def test_error_answers_match_the_error_schema(document) -> None:
    response, _ = error_response(NotFound("unknown model 'nope'"), "GET /v2/models/{name}")
    conforms(document, "Error", orjson.loads(response.body))
