"""How a worker reaches its target: gRPC channels, or HTTP/1.1 keep-alive connections.

A worker opens a client once per target and keeps it between runs, so a benchmark of many runs
pays for its connections once. A client's senders each take one prepared request (bytes: a
serialized v2 message, or a v2 JSON body) and give back what the worker records: the status as
a gRPC code number, the error message, and the answer's flags (1 degraded, 2 cached), read only
when the run inspects answers. Nothing is encoded per request, and nothing decoded unless
inspected.

gRPC: `connections` channels, one TCP connection each, each carrying many requests at once
(HTTP/2 streams). HTTP: one aiohttp session that keeps at most `connections` connections; as
HTTP/1.1 carries one request at a time on each, a request beyond that waits for one to free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp
import grpc

from bench.load import codes, rest
from bench.load.schedule import Plan
from bench.load.transport import aio_channel
from strata.proto.inference import grpc_service_pb2 as v2

INFER = "/inference.GRPCInferenceService/ModelInfer"
MAX_MESSAGE = 64 * 1024 * 1024
OK = grpc.StatusCode.OK.value[0]
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE.value[0]
DEADLINE_EXCEEDED = grpc.StatusCode.DEADLINE_EXCEEDED.value[0]

Outcome = tuple[int, str | None, int]  # code number, error message (None: answered), flags
Send = Callable[[bytes], Awaitable[Outcome]]


class Client(Protocol):
    """A worker's connections to one target."""

    async def ready(self, timeout: float) -> None:
        """Return once the target can be reached; ConnectionError saying why it cannot."""

    def senders(self, plan: Plan, inspect: bool) -> list[Send]:
        """How the requests of `plan` go out over these connections, in turn."""

    async def close(self) -> None: ...


def open_client(plan: Plan, connections: int) -> Client:
    """A client for the plan's target, over HTTP for an http:// target, else gRPC."""
    if plan.http:
        return HttpClient(plan.target, connections)
    return GrpcClient(plan, connections)


def unreachable(target: str, timeout: float, why: str) -> ConnectionError:
    return ConnectionError(
        f"cannot connect to {target} within {timeout:g}s ({why}); is the server running there?"
    )


class GrpcClient:
    """`connections` grpc.aio channels, each its own TCP connection."""

    def __init__(self, plan: Plan, connections: int) -> None:
        options = [
            ("grpc.use_local_subchannel_pool", 1),  # one TCP connection per channel
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ]
        self.target = plan.target
        self.channels = [aio_channel(plan.target, plan.tls, options) for _ in range(connections)]

    async def ready(self, timeout: float) -> None:
        try:
            await asyncio.wait_for(
                asyncio.gather(*(c.channel_ready() for c in self.channels)), timeout
            )
        except TimeoutError:
            state = self.channels[0].get_state()
            failed = state is grpc.ChannelConnectivity.TRANSIENT_FAILURE
            why = "connection refused or unreachable" if failed else f"still {state.name}"
            raise unreachable(self.target, timeout, why) from None

    def senders(self, plan: Plan, inspect: bool) -> list[Send]:
        return [_grpc_sender(c.unary_unary(plan.method), plan, inspect) for c in self.channels]

    async def close(self) -> None:
        for channel in self.channels:
            await channel.close()


def _grpc_sender(call: grpc.aio.UnaryUnaryMultiCallable, plan: Plan, inspect: bool) -> Send:
    metadata = plan.metadata or None

    async def send(message: bytes) -> Outcome:
        try:
            reply = await call(message, timeout=plan.timeout, metadata=metadata)
        except grpc.aio.AioRpcError as exc:
            return exc.code().value[0], codes.go_error(exc.code(), exc.details()), 0
        return OK, None, _flags(reply) if inspect else 0

    return send


def _flags(reply: bytes) -> int:
    """1 if the gateway marked the answer degraded, 2 if it came from its cache."""
    parameters = v2.ModelInferResponse.FromString(reply).parameters
    flags = 0
    if "strata.degraded" in parameters and parameters["strata.degraded"].bool_param:
        flags |= 1
    if "strata.cached" in parameters and parameters["strata.cached"].bool_param:
        flags |= 2
    return flags


class HttpClient:
    """One aiohttp session keeping at most `connections` HTTP/1.1 keep-alive connections."""

    def __init__(self, origin: str, connections: int) -> None:
        self.origin = origin
        connector = aiohttp.TCPConnector(limit=connections, ttl_dns_cache=None)
        self.session = aiohttp.ClientSession(connector=connector)

    async def ready(self, timeout: float) -> None:
        """A TCP connection opens (and is closed again): the server is listening."""
        parts = urlsplit(self.origin)
        connect = asyncio.open_connection(parts.hostname, parts.port or 80)
        try:
            _, writer = await asyncio.wait_for(connect, timeout)
        except OSError:  # refused, unreachable, or timed out (TimeoutError is an OSError)
            raise unreachable(self.origin, timeout, "connection refused or unreachable") from None
        writer.close()
        await writer.wait_closed()

    def senders(self, plan: Plan, inspect: bool) -> list[Send]:
        url = self.origin + plan.method
        headers = {"Content-Type": "application/json", **dict(plan.metadata)}
        timeout = aiohttp.ClientTimeout(total=plan.timeout)
        post = self.session.post

        async def send(body: bytes) -> Outcome:
            try:
                async with post(url, data=body, headers=headers, timeout=timeout) as response:
                    status, answer = response.status, await response.read()
            except TimeoutError:
                return DEADLINE_EXCEEDED, f"HTTP: no answer within {plan.timeout or 0:g}s", 0
            except aiohttp.ClientError as exc:
                return UNAVAILABLE, f"HTTP: {type(exc).__name__}: {exc}", 0
            if not 200 <= status < 300:
                return codes.from_http(status), codes.http_error(status, answer), 0
            return OK, None, rest.flags(answer) if inspect else 0

        return [send]

    async def close(self) -> None:
        await self.session.close()
