"""The gateway's v2 REST API with real processes: tritonclient.http and plain HTTP get the
bytes gRPC gets, every endpoint answers, every failure has its status and says what was
wrong (never a 500), metrics tell the protocols apart, and SIGTERM drains REST requests."""

import base64
import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.security.credentials import key_hash
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.test_control import ADMIN_TOKEN, reload_with
from tests.e2e.test_metrics import scrape, total
from tests.support.system import ROOT, free_port, run_client, running_system

DATA = ROOT / "build" / "data"
MAX_BODY = 200_000
MAX_VALUES = 4096
KEY = "rest-api-key-for-tests"
ROWS = 16
INFER = "/v2/models/digits/infer"
# Every answer comes from the chain (a cached one would only repeat what gRPC was given).
CHANGES = {
    "gateway": {
        "admin_token": ADMIN_TOKEN,
        "cache": {"max_entries": 0},
        "breaker": {"open_seconds": 0.5},
        "rest": {"max_body_bytes": MAX_BODY, "max_json_values": MAX_VALUES},
    },
}
HTTP = requests.Session()
HTTP.trust_env = False  # loopback: no proxy from the environment


def with_metrics(changes: dict) -> dict:
    """`changes` with the gateway's metrics page on a free port."""
    return {**changes, "services": {"gateway": {"metrics": f"127.0.0.1:{free_port()}"}}}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with running_system(tmp_path_factory.mktemp("rest"), with_metrics(CHANGES)) as supervisor:
        yield supervisor


def rest_address(system: Supervisor) -> str:
    return system.settings.services.gateway.rest


def url(system: Supervisor, path: str) -> str:
    return f"http://{rest_address(system)}{path}"


def images(rows: int = ROWS) -> np.ndarray:
    return np.load(DATA / "digits_test.npz")["images"][:rows]


def image_input(array: np.ndarray, **changes) -> dict:
    return {
        "name": "images",
        "datatype": "UINT8",
        "shape": list(array.shape),
        "data": array.reshape(-1).tolist(),
        **changes,
    }


def body(array: np.ndarray | None = None, arm: str = "control", **changes) -> dict:
    """A digits request as JSON data, on a forced arm; `changes` replace the input's fields."""
    array = images(1) if array is None else array
    return {"inputs": [image_input(array, **changes)], "parameters": {"strata.arm": arm}}


def grpc_infer(system: Supervisor, pipeline: str, arrays: dict, arm: str) -> v2.ModelInferResponse:
    with grpc.insecure_channel(system.address("gateway")) as channel:
        request = codec.build_request(pipeline, arrays)
        request.parameters["strata.arm"].string_param = arm
        return v2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)


def parameters_of(reply: v2.ModelInferResponse) -> dict:
    return {
        key: getattr(value, value.WhichOneof("parameter_choice"))
        for key, value in reply.parameters.items()
    }


def outputs_of(reply: v2.ModelInferResponse) -> dict[str, tuple[str, list[int], bytes]]:
    """Each gRPC output: datatype, shape and raw bytes."""
    return {
        tensor.name: (tensor.datatype, list(tensor.shape), raw)
        for tensor, raw in zip(reply.outputs, reply.raw_output_contents, strict=True)
    }


def raw_of(values: list, datatype: str) -> bytes:
    """JSON data as the v2 raw bytes of `datatype`."""
    if datatype == "BYTES":
        return codec.encode_bytes(values)
    return np.asarray(values, dtype=codec.DTYPES[datatype]).tobytes()


def json_outputs(document: dict) -> dict[str, tuple[str, list[int], bytes]]:
    return {
        o["name"]: (o["datatype"], o["shape"], raw_of(o["data"], o["datatype"]))
        for o in document["outputs"]
    }


def error_of(response: requests.Response, status: int) -> str:
    """The error message of a refusal that must have `status` (and be no bug)."""
    assert response.status_code != 500, response.text
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    message = response.json()["error"]
    assert isinstance(message, str) and message
    return message


@pytest.mark.parametrize(
    ("pipeline", "data", "key", "arms"),
    [
        ("digits", "digits_test", "images", ["control", "canary"]),
        ("tabular", "tabular_test", "features", ["a"]),
    ],
)
def test_tritonclient_http_gets_the_grpc_bytes_as_json_and_binary(
    system: Supervisor, tmp_path: Path, pipeline: str, data: str, key: str, arms: list[str]
) -> None:
    array = np.load(DATA / f"{data}.npz")[key][:ROWS]
    npy = tmp_path / "input.npy"
    np.save(npy, array)
    report = run_client("triton_http", rest_address(system), pipeline, str(npy), key, *arms)
    assert report["live"] and report["ready"] and report["model_ready"]
    assert report["server"]["name"] == "strata"
    assert report["metadata"]["name"] == pipeline
    for arm in arms:
        reply = grpc_infer(system, pipeline, {key: array}, arm)
        expected = outputs_of(reply)
        answers = report["answers"][arm]
        binary = {
            name: (o["datatype"], o["shape"], base64.b64decode(o["base64"]))
            for name, o in answers["binary"]["outputs"].items()
        }
        as_json = {
            name: (o["datatype"], o["shape"], raw_of(o["data"], o["datatype"]))
            for name, o in answers["json"]["outputs"].items()
        }
        assert binary == expected, arm
        assert as_json == expected, arm
        for kind in ("json", "binary"):
            assert answers[kind]["parameters"] == parameters_of(reply), (arm, kind)
    success = report["statistics"]["model_stats"][0]["inference_stats"]["success"]
    assert success["count"] >= 2 * len(arms)


def test_binary_data_both_ways_carries_the_grpc_raw_bytes(system: Supervisor) -> None:
    array = images()
    reply = grpc_infer(system, "digits", {"images": array}, "canary")
    document = {
        "inputs": [
            {
                "name": "images",
                "datatype": "UINT8",
                "shape": list(array.shape),
                "parameters": {"binary_data_size": array.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True, "strata.arm": "canary"},
    }
    header = json.dumps(document).encode()
    response = HTTP.post(
        url(system, INFER),
        data=header + array.tobytes(),
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    length = int(response.headers["inference-header-content-length"])
    answer = json.loads(response.content[:length])
    sizes = [o["parameters"]["binary_data_size"] for o in answer["outputs"]]
    assert sizes == [len(raw) for raw in reply.raw_output_contents]
    assert response.content[length:] == b"".join(reply.raw_output_contents)
    assert answer["parameters"] == parameters_of(reply)


def test_each_output_may_ask_for_binary_or_json_data(system: Supervisor) -> None:
    array = images(4)
    expected = outputs_of(grpc_infer(system, "digits", {"images": array}, "control"))
    document = body(array)
    document["outputs"] = [
        {"name": "labels", "parameters": {"binary_data": True}},
        {"name": "scores"},
    ]
    response = HTTP.post(url(system, INFER), json=document, timeout=10)
    assert response.status_code == 200, response.text
    length = int(response.headers["inference-header-content-length"])
    labels, scores = json.loads(response.content[:length])["outputs"]
    assert labels["parameters"] == {"binary_data_size": len(expected["labels"][2])}
    assert "data" not in labels and "parameters" not in scores
    assert response.content[length:] == expected["labels"][2]
    assert raw_of(scores["data"], "FP32") == expected["scores"][2]
    # binary_data_output asks for every output as binary data, unless one says otherwise.
    document["parameters"]["binary_data_output"] = True
    document["outputs"] = [{"name": "scores", "parameters": {"binary_data": False}}]
    only = HTTP.post(url(system, INFER), json=document, timeout=10)
    assert only.status_code == 200 and only.headers["content-type"] == "application/json"
    assert json_outputs(only.json()) == {"scores": expected["scores"]}


def test_json_data_may_be_flat_or_nested(system: Supervisor) -> None:
    array = images(3)
    expected = outputs_of(grpc_infer(system, "digits", {"images": array}, "control"))
    flat = HTTP.post(url(system, INFER), json=body(array), timeout=10)
    nested = HTTP.post(url(system, INFER), json=body(array, data=array.tolist()), timeout=10)
    assert flat.status_code == nested.status_code == 200, (flat.text, nested.text)
    assert json_outputs(flat.json()) == json_outputs(nested.json()) == expected


def test_response_parameters_say_what_happened_as_on_grpc(system: Supervisor) -> None:
    for arm, version in (("control", "1"), ("canary", "2")):
        response = HTTP.post(url(system, INFER), json=body(arm=arm), timeout=10)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["parameters"] == {
            "strata.arm": arm,
            "strata.model_version": version,
            "strata.level": 0,
            "strata.degraded": False,
        }
        reply = grpc_infer(system, "digits", {"images": images(1)}, arm)
        assert answer["parameters"] == parameters_of(reply)
        assert (answer["model_name"], answer["model_version"]) == ("digits", version)
        assert reply.model_version == version


def test_every_endpoint_answers(system: Supervisor) -> None:
    with grpc.insecure_channel(system.address("gateway")) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        grpc_metadata = stub.ModelMetadata(v2.ModelMetadataRequest(name="digits"), timeout=5)
    before = HTTP.get(url(system, "/v2/models/digits/stats"), timeout=5).json()
    assert HTTP.post(url(system, INFER), json=body(), timeout=10).status_code == 200

    def get(path: str) -> dict:
        response = HTTP.get(url(system, path), timeout=5)
        assert response.status_code == 200, (path, response.text)
        assert response.headers["content-type"] == "application/json"
        return response.json()

    assert get("/v2/health/live") == {"live": True}
    assert get("/v2/health/ready") == {"ready": True}
    server = get("/v2")
    assert server["name"] == "strata" and server["version"]
    assert {"binary_tensor_data", "statistics"} <= set(server["extensions"])
    metadata = get("/v2/models/digits")
    assert metadata == get("/v2/models/digits/versions/1")
    assert metadata == {
        "name": grpc_metadata.name,
        "versions": list(grpc_metadata.versions),
        "platform": grpc_metadata.platform,
        "inputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in grpc_metadata.inputs
        ],
        "outputs": [
            {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
            for t in grpc_metadata.outputs
        ],
    }
    assert get("/v2/models/digits/ready") == {"name": "digits", "ready": True}
    assert get("/v2/models/tabular/versions/1/ready") == {"name": "tabular", "ready": True}
    after = get("/v2/models/digits/stats")["model_stats"][0]
    assert get("/v2/models/digits/versions/1/stats")["model_stats"][0]["name"] == "digits"
    counted = before["model_stats"][0]["inference_stats"]["success"]["count"]
    assert after["inference_stats"]["success"]["count"] == counted + 1
    assert isinstance(after["inference_count"], int) and after["last_inference"] > 0
    assert [s["name"] for s in get("/v2/models/stats")["model_stats"]] == [
        "digits",
        "digits-cascade",
        "tabular",
    ]
    document = get("/openapi.json")
    assert document["openapi"].startswith("3.")
    assert "/v2/models/{name}/infer" in document["paths"]


def nested(depth: int) -> list:
    """A value nested `depth` lists deep."""
    value: list | int = 0
    for _ in range(depth):
        value = [value]
    return value


def with_binary(size: int, sent: bytes) -> dict:
    """A request whose input says `size` bytes of binary data follow; `sent` follow."""
    document = {"inputs": [image_input(images(1), parameters={"binary_data_size": size})]}
    del document["inputs"][0]["data"]
    header = json.dumps(document).encode()
    return {
        "data": header + sent,
        "headers": {"Inference-Header-Content-Length": str(len(header))},
    }


BAD_REQUESTS = [
    ("not_json", "POST", INFER, {"data": b'{"inputs": ['}, 400, ["not valid JSON"]),
    ("not_an_object", "POST", INFER, {"json": [1, 2]}, 400, ["JSON object"]),
    ("no_inputs", "POST", INFER, {"json": {"inputs": []}}, 400, ["inputs"]),
    (
        "wrong_datatype",
        "POST",
        INFER,
        {"json": body(datatype="FP32", data=[0.5] * 64)},
        400,
        ["images", "FP32", "UINT8"],
    ),
    (
        "wrong_datatype_whose_range_the_values_leave",  # named as a datatype, as over gRPC
        "POST",
        INFER,
        {"json": body(datatype="INT8", data=[200] * 64)},
        400,
        ["images", "datatype INT8, expected UINT8"],
    ),
    ("wrong_rank", "POST", INFER, {"json": body(shape=[64])}, 400, ["images", "rank"]),
    ("too_few_values", "POST", INFER, {"json": body(data=[0] * 10)}, 400, ["64 values", "10"]),
    ("out_of_range", "POST", INFER, {"json": body(data=[300] * 64)}, 400, ["out of range"]),
    ("not_numbers", "POST", INFER, {"json": body(data=["a"] * 64)}, 400, ["not UINT8"]),
    ("unknown_input", "POST", INFER, {"json": body(name="pixels")}, 400, ["pixels", "images"]),
    ("unhashable_name", "POST", INFER, {"json": body(name=["images"])}, 400, ["`name`, a string"]),
    (
        "bad_parameter",
        "POST",
        INFER,
        {"json": {**body(), "parameters": {"colour": [1]}}},
        400,
        ["'colour'"],
    ),
    (
        "classification",
        "POST",
        INFER,
        {"json": {**body(), "outputs": [{"name": "labels", "parameters": {"classification": 3}}]}},
        400,
        ["classification"],
    ),
    ("too_deep", "POST", INFER, {"json": body(data=nested(20))}, 400, ["nests", "16"]),
    (
        "too_many_values",
        "POST",
        INFER,
        {"json": body(data=[0] * (MAX_VALUES + 1))},
        400,
        ["values", str(MAX_VALUES), "binary_data_size"],
    ),
    ("binary_size_past_the_body", "POST", INFER, with_binary(64, b"\0" * 10), 400, ["64", "10"]),
    ("binary_left_over", "POST", INFER, with_binary(64, b"\0" * 70), 400, ["6 bytes"]),
    (
        "bad_header_length",
        "POST",
        INFER,
        {"json": body(), "headers": {"Inference-Header-Content-Length": "many"}},
        400,
        ["inference-header-content-length", "integer"],
    ),
    (
        "superscript_header_length",
        "POST",
        INFER,
        {"json": body(), "headers": {"Inference-Header-Content-Length": "\u00b9"}},
        400,
        ["inference-header-content-length", "integer"],
    ),
    (
        "header_length_past_the_body",
        "POST",
        INFER,
        {"json": body(), "headers": {"Inference-Header-Content-Length": "99999"}},
        400,
        ["99999", "bytes"],
    ),
    (
        "bad_deadline",
        "POST",
        INFER,
        {"json": body(), "headers": {"x-strata-timeout-ms": "soon"}},
        400,
        ["x-strata-timeout-ms", "milliseconds"],
    ),
    ("unknown_model", "POST", "/v2/models/nope/infer", {"json": body()}, 404, ["nope", "digits"]),
    (
        "unknown_version",
        "POST",
        "/v2/models/digits/versions/7/infer",
        {"json": body()},
        404,
        ["digits", "'7'"],
    ),
    ("unknown_metadata", "GET", "/v2/models/nope", {}, 404, ["nope"]),
    ("unknown_ready", "GET", "/v2/models/nope/ready", {}, 404, ["nope"]),
    ("unknown_version_ready", "GET", "/v2/models/digits/versions/7/ready", {}, 404, ["'7'"]),
    ("unknown_stats", "GET", "/v2/models/nope/stats", {}, 404, ["nope"]),
    ("unknown_path", "GET", "/v2/nope", {}, 404, ["/v2/nope", "Not Found"]),
    ("wrong_method", "GET", INFER, {}, 405, ["GET", "Method Not Allowed"]),
]


@pytest.mark.parametrize(
    ("method", "path", "sent", "status", "words"),
    [pytest.param(*case[1:], id=case[0]) for case in BAD_REQUESTS],
)
def test_a_bad_request_gets_its_status_and_says_what_was_wrong(
    system: Supervisor, method: str, path: str, sent: dict, status: int, words: list[str]
) -> None:
    message = error_of(HTTP.request(method, url(system, path), timeout=10, **sent), status)
    for word in words:
        assert word in message


def test_a_body_over_the_limit_is_refused_by_its_declared_length(system: Supervisor) -> None:
    host, _, port = rest_address(system).rpartition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=5)
    try:  # only the headers and a few bytes: the answer must not wait for the rest
        connection.putrequest("POST", INFER)
        connection.putheader("Content-Type", "application/json")
        connection.putheader("Content-Length", str(1 << 30))
        connection.endheaders(b'{"inputs": [')
        response = connection.getresponse()
        status, document = response.status, json.loads(response.read())
    finally:
        connection.close()
    assert status == 413
    assert str(1 << 30) in document["error"] and str(MAX_BODY) in document["error"]
    # A body of no declared length (chunked) is refused once it passes the limit.
    chunks = (b"0" * 10_000 for _ in range(MAX_BODY // 10_000 + 2))
    message = error_of(HTTP.post(url(system, INFER), data=chunks, timeout=10), 413)
    assert str(MAX_BODY) in message


def test_a_tiny_deadline_is_a_gateway_timeout(system: Supervisor) -> None:
    response = HTTP.post(
        url(system, INFER), json=body(), headers={"x-strata-timeout-ms": "0.001"}, timeout=10
    )
    assert "deadline" in error_of(response, 504)


@contextmanager
def reloaded(system: Supervisor, change: Callable[[dict], None]) -> Iterator[None]:
    """The gateway running with the config as `change` edits it, and as before afterwards."""
    assert list(reload_with(system, change).applied)
    try:
        yield
    finally:
        reload_with(system, lambda raw: None)


def test_api_keys_are_required_once_configured(system: Supervisor) -> None:
    keys = [
        {"client_id": "alice", "sha256": key_hash(KEY), "capabilities": ["force_arm"]},
        {"client_id": "bob", "sha256": key_hash("bob-" + KEY)},
    ]
    with reloaded(system, lambda raw: raw["gateway"].update(api_keys=keys)):
        # body() forces an arm: a capability bob's key is not granted.
        forcing = HTTP.post(
            url(system, INFER), json=body(), headers={"x-api-key": "bob-" + KEY}, timeout=10
        )
        refused = {
            "none": HTTP.post(url(system, INFER), json=body(), timeout=10),
            "wrong": HTTP.post(
                url(system, INFER), json=body(), headers={"x-api-key": "wrong-key"}, timeout=10
            ),
            "metadata": HTTP.get(url(system, "/v2/models/digits"), timeout=5),
            "ready": HTTP.get(url(system, "/v2/models/digits/ready"), timeout=5),
        }
        keyed = HTTP.post(url(system, INFER), json=body(), headers={"x-api-key": KEY}, timeout=10)
    for case, response in refused.items():
        message = error_of(response, 401)
        assert "x-api-key" in message and "wrong-key" not in message, case
    assert keyed.status_code == 200, keyed.text
    assert "'force_arm' capability" in error_of(forcing, 403)
    assert HTTP.post(url(system, INFER), json=body(), timeout=10).status_code == 200


def test_over_its_rate_limit_a_client_gets_429_with_retry_after(system: Supervisor) -> None:
    # A token a minute: six requests take seconds on a busy machine, and at 1 per second the
    # bucket would refill under them.
    limits = {"per_client": {"rate": 1 / 60, "burst": 2}}
    headers = {"x-client-id": "flood"}
    with reloaded(system, lambda raw: raw["gateway"].update(rate_limits=limits)):
        responses = [
            HTTP.post(url(system, INFER), json=body(), headers=headers, timeout=10)
            for _ in range(6)
        ]
    codes = [r.status_code for r in responses]
    assert set(codes) == {200, 429} and codes.count(200) <= 3, codes
    for response in responses:
        if response.status_code == 429:
            assert "rate limit (client) exceeded" in error_of(response, 429)
            assert int(response.headers["retry-after"]) >= 1
            assert int(response.headers["retry-after-ms"]) >= 1


def test_requests_are_counted_by_protocol(system: Supervisor) -> None:
    assert HTTP.post(url(system, INFER), json=body(), timeout=10).status_code == 200
    bad = HTTP.post(url(system, INFER), json=body(datatype="FP32", data=[0.5] * 64), timeout=10)
    error_of(bad, 400)
    grpc_infer(system, "digits", {"images": images(1)}, "control")
    families = scrape(system.settings.services.gateway.metrics)
    requests_total = families["strata_gateway_requests"]

    def counted(protocol: str, code: str) -> float:
        return total(
            requests_total,
            "strata_gateway_requests_total",
            pipeline="digits",
            code=code,
            protocol=protocol,
        )

    assert counted("rest", "OK") >= 1 and counted("grpc", "OK") >= 1
    assert counted("rest", "INVALID_ARGUMENT") >= 1
    durations = families["strata_gateway_request_duration_seconds"]
    for protocol in ("rest", "grpc"):
        name = "strata_gateway_request_duration_seconds_count"
        assert total(durations, name, pipeline="digits", protocol=protocol) >= 1
    rpcs = families["strata_rpc_server_requests"]
    method = "POST /v2/models/{name}/infer"
    assert total(rpcs, "strata_rpc_server_requests_total", method=method, code="OK") >= 1


def test_a_refused_rest_request_is_counted_as_a_grpc_one_is(system: Supervisor) -> None:
    keys = [{"client_id": "alice", "sha256": key_hash(KEY)}]
    metrics = system.settings.services.gateway.metrics

    def refusals() -> dict[str, float]:
        samples = scrape(metrics)["strata_gateway_requests"]
        name = "strata_gateway_requests_total"
        return {
            protocol: total(samples, name, code="UNAUTHENTICATED", protocol=protocol)
            for protocol in ("grpc", "rest")
        }

    with reloaded(system, lambda raw: raw["gateway"].update(api_keys=keys)):
        before = refusals()
        with pytest.raises(grpc.RpcError):
            grpc_infer(system, "digits", {"images": images(1)}, "control")
        error_of(HTTP.post(url(system, INFER), json=body(), timeout=10), 401)
        after = refusals()
    assert after["grpc"] == before["grpc"] + 1
    assert after["rest"] == before["rest"] + 1


def until(check: Callable[[], bool], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


# Last of the shared system's tests: the outage it causes moves the ladder's error signal.
def test_without_an_upstream_the_answer_is_503_and_the_server_not_ready(
    system: Supervisor,
) -> None:
    system.stop("postprocess")
    try:
        outage = HTTP.post(url(system, INFER), json=body(), timeout=10)
        not_ready = until(
            lambda: HTTP.get(url(system, "/v2/health/ready"), timeout=5).status_code == 400,
            within=10,
        )
        ready = HTTP.get(url(system, "/v2/health/ready"), timeout=5)
    finally:
        system.start("postprocess")
    message = error_of(outage, 503)
    assert "postprocess" in message
    assert not_ready and ready.json() == {"ready": False}
    assert until(
        lambda: HTTP.post(url(system, INFER), json=body(), timeout=10).status_code == 200,
        within=20,
    ), "answers again once postprocess is back"


def test_sigterm_lets_rest_requests_in_flight_finish(tmp_path: Path) -> None:
    # Each inference batch waits its whole window (1 s) for company that never comes: the
    # requests are still in the chain when the gateway is told to stop.
    changes = {"inference": {"batching": {"policy": "fixed", "max_queue_delay_ms": 1000}}}
    count = 6
    codes: list[int] = []
    with running_system(tmp_path, with_metrics(changes)) as system:
        metrics = system.settings.services.gateway.metrics

        def send() -> None:
            with requests.Session() as session:
                session.trust_env = False
                codes.append(session.post(url(system, INFER), json=body(), timeout=10).status_code)

        senders = [threading.Thread(target=send) for _ in range(count)]
        for sender in senders:
            sender.start()
        inflight = until(lambda: in_flight(metrics) >= count, within=5)
        exit_code = system.stop("gateway")
        for sender in senders:
            sender.join()
        with pytest.raises(requests.ConnectionError):
            HTTP.get(url(system, "/v2/health/live"), timeout=2)
    assert inflight, "the requests were in flight when SIGTERM came"
    assert exit_code == 0
    assert codes == [200] * count


def in_flight(metrics: str) -> float:
    """The requests the gateway holds now, from its metrics page at `metrics`."""
    name = "strata_gateway_inflight_requests"
    return total(scrape(metrics)[name], name)


def test_a_rest_request_still_in_flight_when_the_grace_ends_is_told_to_go_elsewhere(
    tmp_path: Path,
) -> None:
    # Each batch waits 5 s for company, past the gateway's 1 s of grace after SIGTERM.
    changes = {
        "server": {"grace_seconds": 1},
        "inference": {"batching": {"policy": "fixed", "max_queue_delay_ms": 5000}},
    }
    answers: list[requests.Response] = []
    with running_system(tmp_path, with_metrics(changes)) as system:
        metrics = system.settings.services.gateway.metrics
        sender = threading.Thread(
            target=lambda: answers.append(HTTP.post(url(system, INFER), json=body(), timeout=20))
        )
        sender.start()
        inflight = until(lambda: in_flight(metrics) >= 1, within=5)
        system.stop("gateway")
        sender.join()
    assert inflight, "the request was in flight when SIGTERM came"
    (answer,) = answers
    assert answer.status_code == 503, answer.text
    assert "grace after SIGTERM" in answer.json()["error"]
