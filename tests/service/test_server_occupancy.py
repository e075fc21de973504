"""What every server built by strata.rpc.server does at its door, on real aio servers: calls held
open are capped in all and per client address while health checks still answer, compressed
messages are refused before they inflate, and reflection can be turned off."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from strata.config.server import ServerSettings
from strata.rpc.server import start_server
from strata.security.occupancy import REFUSED

CHECK = health_pb2.HealthCheckRequest()


@asynccontextmanager
async def server(listen: str = "127.0.0.1:0", **settings) -> AsyncIterator[int]:
    """A server with health (and reflection, unless off) alone, public as the gateway's."""
    running = await start_server([], listen, ServerSettings(**settings), public=True)
    try:
        yield running.port
    finally:
        await running.server.stop(0)


async def hold_watches(channel: grpc.aio.Channel, count: int) -> list:
    """`count` Health/Watch streams, each open (its first answer read) and left idle."""
    stub = health_pb2_grpc.HealthStub(channel)
    calls = [stub.Watch(CHECK) for _ in range(count)]
    for call in calls:
        await call.read()
    return calls


async def refused(channel: grpc.aio.Channel) -> grpc.aio.AioRpcError:
    """The error of one more Watch stream, which the door must refuse."""
    call = health_pb2_grpc.HealthStub(channel).Watch(CHECK)
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    return info.value


def refusals(reason: str) -> float:
    return REFUSED.labels(reason)._value.get()


def test_held_calls_fill_the_server_but_health_checks_answer() -> None:
    async def go() -> tuple[grpc.aio.AioRpcError, int]:
        async with server(max_concurrent_rpcs=4) as port:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            held = await hold_watches(channel, 4)
            error = await refused(channel)
            reply = await health_pb2_grpc.HealthStub(channel).Check(CHECK, timeout=1)
            for call in held:
                call.cancel()
            await channel.close()
            return error, reply.status

    before = refusals("calls")
    error, status = asyncio.run(go())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "at most 4 calls at once" in error.details()
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert refusals("calls") == before + 1


def test_one_address_cannot_take_the_calls_of_another() -> None:
    async def go() -> tuple[grpc.aio.AioRpcError, int]:
        async with server("[::]:0", max_calls_per_client=3) as port:
            mine = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            other = grpc.aio.insecure_channel(f"[::1]:{port}")
            held = await hold_watches(mine, 3)
            error = await refused(mine)
            others = await hold_watches(other, 3)
            for call in held + others:
                call.cancel()
            await mine.close()
            await other.close()
            return error, len(others)

    before = refusals("calls_per_client")
    error, served = asyncio.run(go())
    assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "your address holds 3 open calls" in error.details()
    assert ("retry-after-ms", "100") in tuple(error.trailing_metadata())
    assert served == 3
    assert refusals("calls_per_client") == before + 1


def compressed_check(port: int) -> grpc.StatusCode:
    """A gzip-compressed health check's status code."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        try:
            check(CHECK, compression=grpc.Compression.Gzip, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_compressed_messages_are_refused_unless_accepted() -> None:
    async def go(accept: bool) -> grpc.StatusCode:
        async with server(accept_compressed=accept) as port:
            return await asyncio.to_thread(compressed_check, port)

    assert asyncio.run(go(False)) == grpc.StatusCode.UNIMPLEMENTED
    assert asyncio.run(go(True)) == grpc.StatusCode.OK


def listed(port: int) -> grpc.StatusCode | set[str]:
    """The services reflection lists, or its status code when there is none."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        try:
            (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return {s.name for s in reply.list_services_response.service}


def test_reflection_can_be_turned_off() -> None:
    async def go(on: bool) -> grpc.StatusCode | set[str]:
        async with server(reflection=on) as port:
            return await asyncio.to_thread(listed, port)

    assert "grpc.health.v1.Health" in asyncio.run(go(True))
    assert asyncio.run(go(False)) == grpc.StatusCode.UNIMPLEMENTED
