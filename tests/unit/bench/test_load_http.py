"""The load tool's HTTP mode: v2 JSON bodies made from v2 messages, and runs against a tiny
aiohttp server on loopback that answers with whatever status each body asks for."""

import asyncio
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import numpy as np
import pytest
from aiohttp import web

from bench.load import codes, rest
from bench.load.clients import open_client
from bench.load.schedule import Plan, split
from bench.load.worker import Record, Runner
from strata.wire import codec

PATH = "/v2/models/digits/infer"
OK, NOT_FOUND, RESOURCE_EXHAUSTED, UNAVAILABLE, DEADLINE_EXCEEDED = 0, 5, 8, 14, 4
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def body(status: int, **parameters: object) -> bytes:
    """A request body telling the test server which status to answer, with which parameters."""
    return json.dumps({"status": status, "parameters": parameters}).encode()


async def answer_as_asked(request: web.Request) -> web.Response:
    asked = await request.json()
    if asked["status"] != 200:
        return web.json_response({"error": f"asked for {asked['status']}"}, status=asked["status"])
    return web.json_response({"model_name": "digits", "parameters": asked["parameters"]})


@dataclass
class Served:
    origin: str  # http://127.0.0.1:PORT
    peers: set = field(default_factory=set)  # every client connection seen


@asynccontextmanager
async def serving(handler: Handler = answer_as_asked) -> AsyncIterator[Served]:
    """`handler` at PATH on a free loopback port."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    served = Served(f"http://127.0.0.1:{sock.getsockname()[1]}")

    async def handle(request: web.Request) -> web.StreamResponse:
        served.peers.add(request.transport.get_extra_info("peername"))
        return await handler(request)

    app = web.Application()
    app.router.add_post(PATH, handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    try:
        yield served
    finally:
        await runner.cleanup()


async def run(plan: Plan) -> Record:
    """The plan sent from this process, as one worker sends it."""
    (job,) = split(plan, 1)
    client = open_client(plan, job.connections)
    try:
        await client.ready(plan.connect_timeout)
        sends = client.senders(plan, inspect=True)
        return await Runner(job, sends, 0, [0], threading.Event()).run(time.time())
    finally:
        await client.close()


def http_plan(origin: str, requests: tuple[bytes, ...], **fields: object) -> Plan:
    defaults = {"concurrency": 4, "connections": 2, "total": 12, "timeout": 5.0}
    return Plan(target=origin, method=PATH, requests=requests, **{**defaults, **fields})


def test_every_answer_is_counted_under_the_grpc_code_of_its_status() -> None:
    requests = (body(200, **{"strata.degraded": True}), body(429), body(503), body(404))

    async def scenario() -> tuple[Record, int]:
        async with serving() as served:
            return await run(http_plan(served.origin, requests)), len(served.peers)

    record, connections = asyncio.run(scenario())
    assert Counter(record.code) == {OK: 3, RESOURCE_EXHAUSTED: 3, UNAVAILABLE: 3, NOT_FOUND: 3}
    assert sorted(record.errors) == [
        "HTTP 404 Not Found: asked for 404",
        "HTTP 429 Too Many Requests: asked for 429",
        "HTTP 503 Service Unavailable: asked for 503",
    ]
    assert Counter(record.flags) == {1: 3, 0: 9}  # the degraded answers, read from their JSON
    assert all(latency > 0 for latency in record.latency)
    assert connections <= 2  # four clients kept to two keep-alive connections


def test_a_request_past_its_timeout_is_deadline_exceeded() -> None:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.3)
        return web.json_response({})

    async def scenario() -> Record:
        async with serving(slow) as served:
            return await run(http_plan(served.origin, (b"{}",), total=2, timeout=0.05))

    record = asyncio.run(scenario())
    assert list(record.code) == [DEADLINE_EXCEEDED, DEADLINE_EXCEEDED]
    assert record.errors == ["HTTP: no answer within 0.05s"]


def test_an_unreachable_server_is_a_connection_error_naming_it() -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        origin = f"http://127.0.0.1:{probe.getsockname()[1]}"

    async def scenario() -> None:
        client = open_client(http_plan(origin, (b"{}",)), 1)
        try:
            await client.ready(1.0)
        finally:
            await client.close()

    with pytest.raises(ConnectionError, match=f"cannot connect to {origin} within 1s"):
        asyncio.run(scenario())


@pytest.mark.parametrize(
    ("status", "code"),
    [(200, 0), (204, 0), (400, 3), (404, 5), (429, 8), (503, 14), (504, 4), (502, 13), (418, 2)],
)
def test_http_statuses_map_to_the_grpc_codes_they_stand_for(status: int, code: int) -> None:
    assert codes.from_http(status) == code


def test_an_error_body_that_is_not_v2_json_is_reported_as_text() -> None:
    assert codes.http_error(502, b"<html>bad gateway</html>") == (
        "HTTP 502 Bad Gateway: <html>bad gateway</html>"
    )


def test_a_v2_message_becomes_the_v2_json_body_with_flat_row_major_data() -> None:
    images = np.arange(8, dtype=np.uint8).reshape(2, 2, 2)
    request = codec.build_request("digits", {"images": images}, request_id="r1")
    request.parameters["strata.arm"].string_param = "a"
    request.outputs.add(name="labels").parameters["top"].int64_param = 3
    text = request.inputs.add(name="text", datatype="BYTES", shape=[2])
    text.contents.bytes_contents.extend(["héllo".encode(), b"world"])
    request.ClearField("raw_input_contents")
    request.inputs[0].contents.uint_contents.extend(images.reshape(-1).tolist())
    assert json.loads(rest.json_body(request.SerializeToString())) == {
        "id": "r1",
        "parameters": {"strata.arm": "a"},
        "inputs": [
            {"name": "images", "datatype": "UINT8", "shape": [2, 2, 2], "data": list(range(8))},
            {"name": "text", "datatype": "BYTES", "shape": [2], "data": ["héllo", "world"]},
        ],
        "outputs": [{"name": "labels", "parameters": {"top": 3}}],
    }


def test_raw_contents_convert_as_typed_ones_do() -> None:
    features = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    raw = codec.build_request("tabular", {"features": features}).SerializeToString()
    got = json.loads(rest.json_body(raw))
    assert got == {
        "inputs": [
            {"name": "features", "datatype": "FP32", "shape": [1, 3], "data": [1.5, -2.0, 3.25]}
        ]
    }


def test_answer_flags_come_from_the_json_parameters() -> None:
    assert rest.flags(b'{"parameters": {"strata.degraded": true, "strata.cached": true}}') == 3
    assert rest.flags(b'{"parameters": {"strata.cached": true}}') == 2
    assert rest.flags(b'{"outputs": []}') == 0


@pytest.mark.parametrize(
    ("url", "parts"),
    [
        ("http://127.0.0.1:8000/v2/models/digits/infer", ("http://127.0.0.1:8000", PATH)),
        (
            "http://h:1/v2/models/m/versions/2/infer",
            ("http://h:1", "/v2/models/m/versions/2/infer"),
        ),
    ],
)
def test_an_infer_url_splits_into_origin_and_path(url: str, parts: tuple[str, str]) -> None:
    assert rest.split_url(url) == parts
    assert rest.model_of(parts[1]) == url.split("/")[5]


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("https://h:1/v2/models/m/infer", "only plaintext http"),
        ("http://h:1/v2/models/m", "not a v2 infer endpoint"),
        ("http://h:1/v2/models/m/infer?x=1", "not a v2 infer endpoint"),
    ],
)
def test_urls_that_are_not_infer_endpoints_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rest.split_url(url)
