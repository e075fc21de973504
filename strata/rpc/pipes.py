"""Pipes: a layer's bidirectional stream methods over a Unix socket, for callers on its host.

A message on a gRPC stream costs each side about 200 us of CPU here, however many are in
flight (grpc.aio hands every completion from its poller thread to the event loop); the same
message as a length-prefixed frame on a socket costs about 15 us with eight in flight and
60 us alone (`python -m bench.pipes`). The gateway sends three such messages a flight and
each layer answers one, so on one host the lanes (services/gateway/upstream/lanes.py) carry
them on a pipe instead, and over gRPC where there is none.

A layer's server (strata.rpc.server) listens, beside its gRPC port, on `pipe_path(folder,
listen)`: its listen address in a folder only its own user can enter (0700, refused if it is
anyone else's), and admits only callers of its own user (SO_PEERCRED), the kernel's word for
who is calling: what a certificate says for a gRPC caller. The stream's handler is the
servicer's own method, so a message is answered, traced, bounded and drained (SIGTERM: each
new message refused with UNAVAILABLE) exactly as on the gRPC stream.

The protocol: each frame is a 4-byte little-endian length, then that many bytes. The caller's
first frame names the method (`/strata.v1.Preprocess/ProcessStream`); the server answers with
a frame of its listen address (so that a caller knows it reached the replica it meant), then
both sides send messages, one a frame. The caller half-closes by shutting its side's writes.
The server's frames start with a byte: `m` a message follows, `s` the stream's status
(`<code> <details>`, code 0 for OK), its last frame.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import struct
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

import grpc
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.message import Message

log = logging.getLogger(__name__)

LENGTH = struct.Struct("<I")
PEER = struct.Struct("3i")  # SO_PEERCRED's struct ucred: pid, uid, gid
FOLDER = "strata-pipes"
_CODES = {code.value[0]: code for code in grpc.StatusCode}
MESSAGE = b"m"
STATUS = b"s"

Answer = TypeVar("Answer", bound=Message)


class PipeRefused(Exception):
    """The pipe cannot be used (no folder of this user's, no server, another replica's)."""


def pipe_folder(root: Path) -> Path:
    """The folder of this user's pipes under `root`."""
    return root / f"{FOLDER}-{os.getuid()}"


def pipe_path(folder: Path, listen: str) -> Path:
    """Where the server listening on `listen` (host:port) has its pipe."""
    name = "".join(c if c.isalnum() or c in ".-" else "_" for c in listen)
    return folder / f"{name}.sock"


def own_folder(folder: Path, create: bool) -> bool:
    """Whether `folder` is this user's alone (made so where `create` and it is missing)."""
    if create:
        with contextlib.suppress(FileExistsError):
            folder.mkdir(mode=0o700)
    try:
        info = folder.lstat()
    except OSError:
        return False
    private = stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700
    return private and info.st_uid == os.getuid()


def _frame(payload: bytes) -> bytes:
    return LENGTH.pack(len(payload)) + payload


def _status(code: grpc.StatusCode, details: str = "") -> bytes:
    return _frame(STATUS + f"{code.value[0]} {details}".encode())


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> bytes | None:
    """The next frame's bytes; None where the other side closed its writes between frames."""
    try:
        head = await reader.readexactly(LENGTH.size)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise
        return None
    (size,) = LENGTH.unpack(head)
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the {limit} a message may have")
    return await reader.readexactly(size)


@dataclass(frozen=True)
class PipedMethod:
    """A servicer's bidirectional stream method and the message it reads."""

    handler: Callable[[AsyncIterator[Message], Any], AsyncIterator[Message]]
    request: type[Message]


def stream_methods(servicer: object, service: str) -> dict[str, PipedMethod]:
    """`servicer`'s bidirectional stream methods of `service` (its full name), by path."""
    described = descriptor_pool.Default().FindServiceByName(service)
    methods = {}
    for method in described.methods:
        handler = getattr(servicer, method.name, None)
        if method.client_streaming and method.server_streaming and handler is not None:
            request = message_factory.GetMessageClass(method.input_type)
            methods[f"/{service}/{method.name}"] = PipedMethod(handler, request)
    return methods


class _Context:
    """What a stream handler asks of its call on a pipe: the stream's deadline, none (as a
    lane's gRPC stream has none; each message carries its own)."""

    def time_remaining(self) -> float | None:
        return None


class PipeServer:
    """A layer's stream methods on its pipe; at most `max_connections` callers at once."""

    def __init__(
        self,
        path: Path,
        listen: str,
        methods: dict[str, PipedMethod],
        max_message_bytes: int,
        max_connections: int,
    ) -> None:
        self.path = path
        self._listen = listen.encode()
        self._methods = methods
        self._limit = max_message_bytes
        self._room = max_connections
        self._server: asyncio.AbstractServer | None = None
        self._serving: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Listen (once); where the socket cannot be made (a path too long, no room), say so
        and serve over gRPC alone."""
        if self._server is not None:
            return
        # A dead process's socket, or a live one's that listens on the same address: its
        # gRPC port would have refused this server before.
        self.path.unlink(missing_ok=True)
        try:
            self._server = await asyncio.start_unix_server(
                self._connected, self.path, limit=1 << 20
            )
        except OSError as exc:
            log.warning("no pipe at %s (%s): gRPC only", self.path, exc.strerror or exc)
            return
        log.info("pipe for %s on %s", ", ".join(self._methods), self.path)

    async def stop(self, grace: float) -> None:
        """Take no new callers; give those connected `grace` seconds to finish."""
        if self._server is None:
            return
        self._server.close()
        self.path.unlink(missing_ok=True)
        if self._serving:
            _, late = await asyncio.wait(self._serving, timeout=grace)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._serving.add(task)
        try:
            if self._admits(writer) and len(self._serving) <= self._room:
                await self._serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            log.debug("pipe caller dropped: %s", exc)
        finally:
            self._serving.discard(task)
            writer.close()

    def _admits(self, writer: asyncio.StreamWriter) -> bool:
        sock = writer.get_extra_info("socket")
        _, uid, _ = PEER.unpack(sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, PEER.size))
        if uid != os.getuid():
            log.warning("pipe %s: refused a caller of user %d", self.path, uid)
            return False
        return True

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        named = await _read_frame(reader, 1024)
        method = self._methods.get((named or b"").decode(errors="replace"))
        writer.write(_frame(self._listen))
        if method is None:
            writer.write(_status(grpc.StatusCode.UNIMPLEMENTED, f"no method {named!r}"))
            return
        status = _status(grpc.StatusCode.OK)
        requests = self._requests(reader, method.request)
        try:
            async for answer in method.handler(requests, _Context()):
                writer.write(_frame(MESSAGE + answer.SerializeToString()))
                await writer.drain()
        except Exception as exc:  # the stream's failure: the caller's lane breaks with it
            if _dropped(exc):
                raise ConnectionError("the caller went") from None
            log.exception("pipe %s: stream failed", self.path)
            status = _status(grpc.StatusCode.INTERNAL, str(exc))
        writer.write(status)
        await writer.drain()

    async def _requests(
        self, reader: asyncio.StreamReader, request: type[Message]
    ) -> AsyncIterator[Message]:
        while (payload := await _read_frame(reader, self._limit)) is not None:
            yield request.FromString(payload)


def _dropped(exc: BaseException) -> bool:
    """Whether `exc` is the caller going away (within the stream's task group's errors)."""
    if isinstance(exc, BaseExceptionGroup):
        return any(_dropped(inner) for inner in exc.exceptions)
    return isinstance(exc, ConnectionError | asyncio.IncompleteReadError)


class PipeCall(Generic[Answer]):
    """One stream over a pipe, as a lane uses a grpc.aio stream call: `write`, `read` (EOF
    once the server ended it well, else AioRpcError), `done_writing`, `done`, `cancel`."""

    def __init__(
        self,
        path: Path,
        method: str,
        answer: type[Answer],
        expect: str,
        max_message_bytes: int,
        refused: Callable[[str], None] = lambda why: None,
    ) -> None:
        """A stream of `method` on the pipe at `path`, whose server must say it listens on
        `expect`; answers parsed as `answer`; `refused` is told why the pipe could not be
        opened, where it could not."""
        self._answer = answer
        self._refused = refused
        self._limit = max_message_bytes
        self._ended = False
        self._connecting = asyncio.get_running_loop().create_task(
            self._connect(path, method, expect)
        )

    async def _connect(
        self, path: Path, method: str, expect: str
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.open_unix_connection(path, limit=1 << 20)
            writer.write(_frame(method.encode()))
            said = await _read_frame(reader, 1024)
        except (OSError, asyncio.IncompleteReadError) as exc:
            self._refused(f"{path}: {getattr(exc, 'strerror', None) or exc}")
            raise PipeRefused(f"{path}: {exc}") from None
        if said != expect.encode():
            writer.close()
            self._refused(f"{path} answered as {said!r}, not {expect}")
            raise PipeRefused(f"{path}: answered as {said!r}, not {expect}")
        return reader, writer

    async def _ends(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            return await self._connecting
        except (PipeRefused, ConnectionError, asyncio.IncompleteReadError) as exc:
            self._ended = True
            raise _failed(grpc.StatusCode.UNAVAILABLE, f"pipe: {exc}") from None

    async def write(self, request: Message) -> None:
        _, writer = await self._ends()
        if self._ended:
            raise asyncio.InvalidStateError("the pipe's stream has ended")
        try:
            writer.write(_frame(request.SerializeToString()))
            await writer.drain()
        except ConnectionError as exc:  # the layer went (killed): retried elsewhere, as gRPC's
            self._end(writer)
            raise _failed(grpc.StatusCode.UNAVAILABLE, f"pipe: {exc}") from None

    async def read(self) -> Answer | Any:
        reader, writer = await self._ends()
        try:
            payload = await _read_frame(reader, self._limit + 1)
            if not payload:
                raise ConnectionError("closed without a status")
            if payload[:1] == MESSAGE:
                # protobuf parses any buffer; a slice of bytes would copy the message
                return self._answer.FromString(cast(bytes, memoryview(payload)[1:]))
        except (ConnectionError, asyncio.IncompleteReadError, ValueError) as exc:
            self._end(writer)
            raise _failed(grpc.StatusCode.UNAVAILABLE, f"pipe: {exc}") from None
        self._end(writer)
        number, _, details = payload[1:].decode(errors="replace").partition(" ")
        code = _CODES.get(int(number) if number.isdigit() else -1, grpc.StatusCode.UNKNOWN)
        if code != grpc.StatusCode.OK:
            raise _failed(code, details)
        return grpc.aio.EOF

    async def done_writing(self) -> None:
        _, writer = await self._ends()
        if writer.can_write_eof() and not writer.is_closing():
            writer.write_eof()

    def done(self) -> bool:
        return self._ended

    def _end(self, writer: asyncio.StreamWriter) -> None:
        """The stream is over: its socket is closed now, not when the collector finds it."""
        self._ended = True
        writer.close()

    def cancel(self) -> bool:
        self._ended = True
        if not self._connecting.done():
            self._connecting.cancel()
        elif not self._connecting.cancelled() and self._connecting.exception() is None:
            self._connecting.result()[1].close()
        return True


def _failed(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


def piped_services(
    registrations: Iterable[tuple[object, str]],
) -> dict[str, PipedMethod]:
    """Every bidirectional stream method of the services registered, by path."""
    methods: dict[str, PipedMethod] = {}
    for servicer, service in registrations:
        methods.update(stream_methods(servicer, service))
    return methods
