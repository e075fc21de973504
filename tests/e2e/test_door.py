"""Issue 32's transport attacks against real processes, with API keys on and no key sent: a
gzip bomb, idle gRPC streams and idle REST connections held to the configured limits, and a
request header (or gRPC's HTTP/2 preface) sent in half and left to stall. The gateway stays
within +64 MiB of RSS and its health answers a new client within 1 s throughout."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.security.credentials import key_hash
from strata.tools.launch import Supervisor
from tests.support.system import running_system

CALLS, PER_CLIENT = 64, 16  # server.max_concurrent_rpcs and .max_calls_per_client
STREAMS = 8  # gateway.max_streams_per_client
KEY = (("x-api-key", "alice-key-for-door-tests"),)
HEADER_TIMEOUT = 1.0
# What a loaded machine (load average 8) may add to a timer or to a new client's health
# check; a server held up by an attack would keep them past the clients' 5 s timeouts.
LATE = 3.0
MiB = 1 << 20
BOMB = 256 * MiB  # inflated; gzip makes it 0.25 MiB on the wire
LIVE, CHECK = v2.ServerLiveRequest(), health_pb2.HealthCheckRequest()
ATTACKERS = [f"127.0.0.{n}" for n in range(2, 2 + CALLS // PER_CLIENT)]
CHANGES = {
    "server": {
        "max_concurrent_rpcs": CALLS,
        "max_calls_per_client": PER_CLIENT,
        "handshake_timeout_seconds": HEADER_TIMEOUT,
    },
    "gateway": {
        "api_keys": [{"client_id": "alice", "sha256": key_hash(KEY[0][1])}],
        "max_streams_per_client": STREAMS,
        "rest": {"header_timeout_seconds": HEADER_TIMEOUT},
    },
}


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with running_system(tmp_path_factory.mktemp("door"), CHANGES) as supervisor:
        yield supervisor


def memory(pid: int, field: str) -> int:
    """One line of /proc/PID/status (VmRSS, VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) // 1024
    raise KeyError(field)


def peak_growth(pid: int, attack) -> tuple[object, int]:
    """What `attack()` returns, and how far above its RSS at the start the process peaked."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM restarts from VmRSS
    before = memory(pid, "VmRSS")
    outcome = attack()
    return outcome, memory(pid, "VmHWM") - before


def gzip_bomb(address: str) -> grpc.StatusCode:
    """ModelInfer with 256 MiB of zeros, gzip-compressed on the wire; no API key."""
    options = [("grpc.max_send_message_length", -1)]
    with grpc.insecure_channel(address, options=options) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        try:
            infer(bytes(BOMB), compression=grpc.Compression.Gzip, timeout=60)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def grpc_health_seconds(address: str) -> float:
    """How long a new client's ServerLive and health Check took, together."""
    started = time.monotonic()
    with grpc.insecure_channel(address) as channel:
        live = v2_grpc.GRPCInferenceServiceStub(channel).ServerLive(LIVE, timeout=5)
        check = health_pb2_grpc.HealthStub(channel).Check(CHECK, timeout=5)
    assert live.live and check.status == health_pb2.HealthCheckResponse.SERVING
    return time.monotonic() - started


def test_a_gzip_bomb_is_refused_before_it_inflates(system: Supervisor) -> None:
    address = system.address("gateway")
    code, grown = peak_growth(system.processes["gateway"].pid, lambda: gzip_bomb(address))
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert grown < 64, f"the gateway's RSS peaked {grown} MiB higher"
    assert grpc_health_seconds(address) < LATE


async def hold(calls: list) -> list:
    """`calls` (streams), each seen open by the server: sent its headers, left idle."""
    await asyncio.gather(*(call.wait_for_connection() for call in calls))
    await asyncio.sleep(0.5)  # every stream reached its handler
    return calls


async def refusal(call) -> grpc.aio.AioRpcError:
    """The error that ends `call`, a stream the server must refuse."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    return info.value


def test_idle_streams_leave_health_to_others(system: Supervisor) -> None:
    address = system.address("gateway")

    async def go() -> tuple[list[grpc.aio.AioRpcError], float]:
        channel = grpc.aio.insecure_channel(address)
        stream = v2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer
        watch = health_pb2_grpc.HealthStub(channel).Watch
        # Alice's share of streams, then her address's share of calls with health watches.
        held = await hold([stream(metadata=KEY) for _ in range(STREAMS)])
        refused = [await refusal(stream()), await refusal(stream(metadata=KEY))]
        held += await hold([watch(CHECK) for _ in range(PER_CLIENT - STREAMS)])
        refused.append(await refusal(watch(CHECK)))
        seconds = await asyncio.to_thread(grpc_health_seconds, address)
        for call in held:
            call.cancel()
        await channel.close()
        return refused, seconds

    (keyless, alice, watch), seconds = asyncio.run(go())
    assert keyless.code() == grpc.StatusCode.UNAUTHENTICATED  # refused as it opens, not held
    assert alice.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"this client holds {STREAMS} open streams" in alice.details()
    assert watch.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"your address holds {PER_CLIENT} open calls" in watch.details()
    assert seconds < LATE


def rest_address(system: Supervisor) -> tuple[str, int]:
    host, _, port = system.settings.services.gateway.rest.rpartition(":")
    return host, int(port)


def connect(address: tuple[str, int], source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to `address` from the loopback address `source`."""
    return socket.create_connection(address, timeout=5, source_address=(source, 0))


def get(address: tuple[str, int], path: str) -> tuple[int, float]:
    """A new client's GET: its status and how long the answer took."""
    started = time.monotonic()
    with connect(address) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nhost: strata\r\nconnection: close\r\n\r\n".encode())
        reply = read_all(sock)
    return int(reply.split()[1]), time.monotonic() - started


def read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_idle_connections_leave_health_to_others(system: Supervisor) -> None:
    address = rest_address(system)
    with ExitStack() as held:
        for source in ATTACKERS:  # the whole REST concurrency limit, a share per address
            for _ in range(PER_CLIENT):
                held.enter_context(connect(address, source))
        with connect(address, ATTACKERS[0]) as extra:
            refusal = read_all(extra)
        assert refusal.startswith(b"HTTP/1.1 503 ") and b"the most one address may" in refusal
        assert b"\r\nretry-after: 1\r\n" in refusal, refusal  # and the gRPC hint's header
        assert b"\r\nretry-after-ms: 100\r\n" in refusal, refusal
        time.sleep(0.2)
        status, seconds = get(address, "/v2/health/live")
        assert (status, seconds < LATE) == (200, True)
        assert get(address, "/v2")[0] == 503  # anything but a probe waits for a free slot


def test_a_stalled_header_is_closed(system: Supervisor) -> None:
    address = rest_address(system)
    with connect(address) as silent, connect(address) as stalled:
        stalled.sendall(b"GET /v2/health/live HTTP/1.1\r\nhost: str")
        started = time.monotonic()
        reply = read_all(stalled)
        waited = time.monotonic() - started
        assert read_all(silent).startswith(b"HTTP/1.1 408 ")
    assert reply.startswith(b"HTTP/1.1 408 ") and b"no whole request header" in reply
    assert HEADER_TIMEOUT - 0.2 < waited < HEADER_TIMEOUT + LATE


def test_a_stalled_grpc_handshake_is_closed(system: Supervisor) -> None:
    host, _, port = system.address("gateway").rpartition(":")
    with connect((host, int(port))) as stalled:
        stalled.sendall(b"PRI * HTTP/2.0\r\n")  # half the preface, then nothing
        started = time.monotonic()
        read_all(stalled)  # the server's SETTINGS, then the close
        waited = time.monotonic() - started
    assert HEADER_TIMEOUT - 0.2 < waited < HEADER_TIMEOUT + LATE


async def write_without_reading(address: str, count: int, seconds: float) -> int:
    """A stream of `count` 64 KiB requests (an unknown model's) that never reads an answer;
    how many the client got written in `seconds`."""
    written = 0
    async with grpc.aio.insecure_channel(address) as channel:
        call = v2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(metadata=KEY)

        async def write() -> None:
            nonlocal written
            for i in range(count):
                request = v2.ModelInferRequest(model_name="no-such-model", id=str(i))
                request.raw_input_contents.append(bytes(64 * 1024))
                await call.write(request)
                written += 1

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(write(), seconds)
        call.cancel()
    return written


def test_an_unread_stream_is_read_only_as_fast_as_it_is_answered(system: Supervisor) -> None:
    address = system.address("gateway")
    pid = system.processes["gateway"].pid
    written, grown = peak_growth(
        pid, lambda: asyncio.run(write_without_reading(address, 4000, 5.0))
    )
    # 4,000 x 64 KiB is 250 MiB written; the server holds at most max_stream_in_flight.
    assert grown < 64, f"the gateway's RSS peaked {grown} MiB higher ({written} written)"
    assert grpc_health_seconds(address) < LATE
