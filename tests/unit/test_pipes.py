"""Pipes (strata.rpc.pipes): a stream method over a real Unix socket, both ends in one loop."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

import strata.rpc.pipes
from bench.pipes import METHOD, SERVICE, Echo
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.pipes import (
    PipeCall,
    PipeServer,
    own_folder,
    pipe_folder,
    pipe_path,
    stream_methods,
)

LISTEN = "127.0.0.1:8101"
LIMIT = 1 << 20


class Broken(Echo):
    """A stream that fails on its first message."""

    async def ProcessStream(
        self, requests: AsyncIterator[v1.ProcessRequest], context: Any
    ) -> AsyncIterator[v1.ProcessResponse]:
        async for _ in requests:
            raise RuntimeError("this stream breaks")
        yield v1.ProcessResponse()


def folder_of(tmp_path: Path) -> Path:
    folder = pipe_folder(tmp_path)
    assert own_folder(folder, create=True)
    return folder


async def serving(tmp_path: Path, listen: str = LISTEN, servicer: object = None) -> PipeServer:
    path = pipe_path(folder_of(tmp_path), listen)
    methods = stream_methods(servicer or Echo(), SERVICE)
    server = PipeServer(path, listen, methods, LIMIT, 4)
    await server.start()
    return server


def test_the_stream_methods_of_a_service_are_found_by_path() -> None:
    methods = stream_methods(Echo(), SERVICE)
    assert list(methods) == [METHOD]
    assert methods[METHOD].request is v1.ProcessRequest


def test_a_folder_anyone_else_may_enter_is_not_used(tmp_path: Path) -> None:
    folder = folder_of(tmp_path)
    assert own_folder(folder, create=False)
    folder.chmod(0o755)
    assert not own_folder(folder, create=False)
    assert not own_folder(tmp_path / "missing", create=False)


def test_messages_go_and_answers_come_back_then_the_stream_ends_well(tmp_path: Path) -> None:
    async def main() -> list[int]:
        server = await serving(tmp_path)
        call = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        for tag in (1, 2, 3):
            await call.write(v1.ProcessRequest(tag=tag))
        tags = [(await call.read()).tag for _ in range(3)]
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        assert call.done()
        _, writer = await call._connecting
        assert writer.is_closing()  # its socket closed with the stream
        await server.stop(1)
        return tags

    assert asyncio.run(main()) == [1, 2, 3]


def test_a_stream_that_fails_ends_with_its_status(tmp_path: Path) -> None:
    async def main() -> grpc.aio.AioRpcError:
        server = await serving(tmp_path, servicer=Broken())
        call = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await call.write(v1.ProcessRequest(tag=1))
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.read()
        await server.stop(1)
        return failed.value

    error = asyncio.run(main())
    assert error.code() == grpc.StatusCode.INTERNAL
    assert "this stream breaks" in str(error.details())


def test_an_unknown_method_is_unimplemented(tmp_path: Path) -> None:
    async def main() -> grpc.aio.AioRpcError:
        server = await serving(tmp_path)
        call = PipeCall(server.path, "/strata.v1.Nothing/Here", v1.ProcessResponse, LISTEN, LIMIT)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.read()
        await server.stop(1)
        return failed.value

    assert asyncio.run(main()).code() == grpc.StatusCode.UNIMPLEMENTED


def test_a_pipe_that_answers_for_another_address_is_refused(tmp_path: Path) -> None:
    said: list[str] = []

    async def main() -> grpc.aio.AioRpcError:
        server = await serving(tmp_path, listen="127.0.0.1:9999")
        call = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT, said.append)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.write(v1.ProcessRequest(tag=1))
        await server.stop(1)
        return failed.value

    assert asyncio.run(main()).code() == grpc.StatusCode.UNAVAILABLE
    assert len(said) == 1 and "127.0.0.1:9999" in said[0]


def test_no_server_is_unavailable_and_said(tmp_path: Path) -> None:
    said: list[str] = []

    async def main() -> grpc.aio.AioRpcError:
        path = pipe_path(folder_of(tmp_path), LISTEN)
        call = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT, said.append)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.read()
        return failed.value

    assert asyncio.run(main()).code() == grpc.StatusCode.UNAVAILABLE
    assert said


def test_a_frame_over_the_limit_breaks_the_stream_not_the_server(tmp_path: Path) -> None:
    async def main() -> int:
        path = pipe_path(folder_of(tmp_path), LISTEN)
        server = PipeServer(path, LISTEN, stream_methods(Echo(), SERVICE), 64, 4)
        await server.start()
        big = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await big.write(v1.ProcessRequest(tag=1, requests=[v1.Request(id="x" * 100)]))
        with pytest.raises(grpc.aio.AioRpcError):
            await big.read()
        small = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await small.write(v1.ProcessRequest(tag=7))
        tag = (await small.read()).tag
        small.cancel()
        await server.stop(1)
        return tag

    assert asyncio.run(main()) == 7


def test_callers_past_the_bound_are_closed_at_once(tmp_path: Path) -> None:
    async def main() -> list[bool]:
        path = pipe_path(folder_of(tmp_path), LISTEN)
        server = PipeServer(path, LISTEN, stream_methods(Echo(), SERVICE), LIMIT, 1)
        await server.start()
        first = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await first.write(v1.ProcessRequest(tag=1))
        assert (await first.read()).tag == 1
        second = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        refused = False
        try:
            await second.write(v1.ProcessRequest(tag=2))
            await second.read()
        except grpc.aio.AioRpcError:
            refused = True
        first.cancel()
        await server.stop(1)
        return [refused, path.exists()]

    assert asyncio.run(main()) == [True, False]


def test_stopping_lets_a_stream_finish_within_the_grace(tmp_path: Path) -> None:
    async def main() -> object:
        server = await serving(tmp_path)
        call = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await call.write(v1.ProcessRequest(tag=5))
        assert (await call.read()).tag == 5
        stopping = asyncio.create_task(server.stop(5))
        await asyncio.sleep(0.05)
        await call.done_writing()  # the caller finishes: the server's stop need not wait on
        ended = await call.read()
        await asyncio.wait_for(stopping, 2)
        return ended

    assert asyncio.run(main()) is grpc.aio.EOF


def test_the_folder_is_per_user(tmp_path: Path) -> None:
    assert pipe_folder(tmp_path).name == f"strata-pipes-{os.getuid()}"
    assert pipe_path(tmp_path, "127.0.0.1:8101").name == "127.0.0.1_8101.sock"


def test_a_caller_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server sees its callers' user from the kernel: here it runs as another user than
    the caller (its getuid says so), so the caller is closed before any message."""

    async def main() -> grpc.StatusCode:
        server = await serving(tmp_path)
        monkeypatch.setattr(strata.rpc.pipes.os, "getuid", lambda: os.getuid() + 1)
        call = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await call.write(v1.ProcessRequest(tag=1))
        monkeypatch.undo()
        await server.stop(1)
        return failed.value.code()

    assert asyncio.run(main()) == grpc.StatusCode.UNAVAILABLE


def test_a_caller_that_goes_mid_stream_costs_the_server_nothing_more(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> int:
        server = await serving(tmp_path)
        gone = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await gone.write(v1.ProcessRequest(tag=1))
        assert (await gone.read()).tag == 1
        gone.cancel()
        await asyncio.sleep(0.1)
        still = PipeCall(server.path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        await still.write(v1.ProcessRequest(tag=2))
        tag = (await still.read()).tag
        still.cancel()
        await server.stop(1)
        return tag

    assert asyncio.run(main()) == 2
    assert not [r for r in caplog.records if r.levelname == "ERROR"]


def test_a_write_to_a_layer_that_went_is_unavailable(tmp_path: Path) -> None:
    """A killed layer's socket: the lane's write fails as gRPC's would, UNAVAILABLE (which
    the hop retries on another replica), never an OSError the lane would call INTERNAL."""

    async def main() -> grpc.StatusCode:
        path = pipe_path(folder_of(tmp_path), LISTEN)

        async def hello_then_gone(reader: Any, writer: asyncio.StreamWriter) -> None:
            writer.write(strata.rpc.pipes._frame(LISTEN.encode()))
            await writer.drain()
            writer.transport.abort()

        server = await asyncio.start_unix_server(hello_then_gone, path)
        call = PipeCall(path, METHOD, v1.ProcessResponse, LISTEN, LIMIT)
        try:
            for tag in range(100):
                await call.write(v1.ProcessRequest(tag=tag))
                await asyncio.sleep(0.01)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
        finally:
            server.close()
        raise AssertionError("every write to a gone layer succeeded")

    assert asyncio.run(main()) == grpc.StatusCode.UNAVAILABLE
