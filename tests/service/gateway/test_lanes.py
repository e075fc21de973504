"""The gateway's hops as messages on long-lived streams (upstream/lanes.py), against
real aio gRPC servers on loopback serving ProcessStream (strata.calls.v1stream) with a handler each
test controls, and the gateway's own Hop on top: answers matched by tag, each message's own
error and deadline, a broken or refused lane falling back to a unary call, a server without
the stream method, draining, and a stream read only as fast as it is answered."""

from __future__ import annotations

import asyncio
import gc
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from services.gateway.upstream.lanes import Lane, LaneBroken, Lanes
from services.gateway.upstream.stream_methods import process_stream
from services.gateway.upstream.upstreams import Hop, open_hop
from strata.calls.streams import Drain
from strata.calls.v1stream import serve_stream
from strata.config import load_settings
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.deadline import Deadline
from tests.support.system import make_config

Handler = Callable[[v1.ProcessRequest], Awaitable[v1.ProcessResponse]]


async def echo(request: v1.ProcessRequest) -> v1.ProcessResponse:
    return v1.ProcessResponse(
        results=[v1.Result(id=item.id, tensors=item.tensors) for item in request.requests]
    )


class Layer(preprocess_pb2_grpc.PreprocessServicer):
    """Process and ProcessStream over one handler; counts what each path served."""

    def __init__(self, handler: Handler, stream: bool = True, max_in_flight: int = 64) -> None:
        self.handler = handler
        self.stream = stream
        self.max_in_flight = max_in_flight
        self.unary = 0
        self.streamed = 0

    async def Process(self, request, context):
        self.unary += 1
        return await self.handler(request)

    async def ProcessStream(self, requests, context) -> AsyncIterator[v1.ProcessResponse]:
        if not self.stream:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "no streams here")

        async def handle(request: v1.ProcessRequest) -> v1.ProcessResponse:
            self.streamed += 1
            return await self.handler(request)

        method = "/strata.v1.Preprocess/ProcessStream"
        async for answer in serve_stream(requests, handle, method, self.max_in_flight):
            yield answer


async def serve(layer: Layer) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    preprocess_pb2_grpc.add_PreprocessServicer_to_server(layer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def request(rid: str) -> v1.ProcessRequest:
    tensor = v1.Tensor(name="x", datatype="UINT8", shape=[1], data=rid.encode()[:1])
    return v1.ProcessRequest(requests=[v1.Request(id=rid, pipeline="p", tensors=[tensor])])


def lanes_to(address: str, count: int = 2) -> tuple[grpc.aio.Channel, Lanes]:
    channel = grpc.aio.insecure_channel(address)
    stub = preprocess_pb2_grpc.PreprocessStub(channel)
    return channel, Lanes("test", process_stream(stub), count, 30, labels=("test", "0"))


def test_concurrent_messages_each_get_their_own_answer() -> None:
    async def go() -> list[str]:
        server, address = await serve(Layer(slow_by_id))
        channel, lanes = lanes_to(address)
        replies = await asyncio.gather(
            *(lanes.call(request(f"r{i}"), 5, False) for i in range(256))
        )
        lanes.close()
        await channel.close()
        await server.stop(0)
        return [reply.results[0].id for reply in replies]

    assert asyncio.run(go()) == [f"r{i}" for i in range(256)]


async def slow_by_id(request: v1.ProcessRequest) -> v1.ProcessResponse:
    """Answers out of order: later ids sooner."""
    await asyncio.sleep(0.001 * (7 - int(request.requests[0].id[1:]) % 8))
    return await echo(request)


def test_a_message_that_fails_carries_its_own_status_and_the_lane_goes_on() -> None:
    async def handler(req: v1.ProcessRequest) -> v1.ProcessResponse:
        if req.requests[0].id == "bad":
            raise ValueError("boom")  # a bug: INTERNAL, for this message only
        return await echo(req)

    async def go():
        server, address = await serve(Layer(handler))
        channel, lanes = lanes_to(address, count=1)
        outcomes = await asyncio.gather(
            lanes.call(request("bad"), 5, False),
            lanes.call(request("ok"), 5, False),
            return_exceptions=True,
        )
        after = await lanes.call(request("after"), 5, False)
        lanes.close()
        await channel.close()
        await server.stop(0)
        return outcomes, after

    (bad, ok), after = asyncio.run(go())
    assert isinstance(bad, grpc.aio.AioRpcError) and bad.code() == grpc.StatusCode.INTERNAL
    assert ok.results[0].id == "ok" and after.results[0].id == "after"


def test_a_missed_timeout_fails_that_message_and_a_hop_timeout_condemns_the_lane() -> None:
    async def go():
        gate = asyncio.Event()

        async def handler(req: v1.ProcessRequest) -> v1.ProcessResponse:
            if req.requests[0].id.startswith("hang"):
                await gate.wait()
            return await echo(req)

        server, address = await serve(Layer(handler))
        channel, lanes = lanes_to(address, count=1)
        waiting = asyncio.ensure_future(lanes.call(request("hang-2"), 5, False))
        await asyncio.sleep(0.05)
        with pytest.raises(grpc.aio.AioRpcError) as missed:
            await lanes.call(request("hang-1"), 0.1, cancel_on_timeout=True)
        with pytest.raises(LaneBroken):
            await waiting  # the condemned lane's other message: to be sent elsewhere
        with pytest.raises(LaneBroken) as resting:
            await lanes.call(request("next"), 5, False)  # its slot rests: the hop goes unary
        gate.set()
        lanes.close()
        await channel.close()
        await server.stop(0)
        return missed.value.code(), str(resting.value)

    labels = {"hop": "test", "replica": "0"}
    before = REGISTRY.get_sample_value("strata_gateway_replica_rests_total", labels) or 0
    code, resting = asyncio.run(go())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "rests" in resting
    rests = REGISTRY.get_sample_value("strata_gateway_replica_rests_total", labels)
    assert rests == before + 1  # the operator sees the replica set aside


def test_a_stream_is_read_only_as_fast_as_it_is_answered() -> None:
    """A client that writes 64 KiB messages and never reads: the server holds
    `max_in_flight` of them, and HTTP/2 flow control soon stops the writer."""

    async def go() -> tuple[int, int]:
        gate = asyncio.Event()

        async def handler(req: v1.ProcessRequest) -> v1.ProcessResponse:
            await gate.wait()
            return await echo(req)

        layer = Layer(handler, max_in_flight=8)
        server, address = await serve(layer)
        channel = grpc.aio.insecure_channel(address)
        call = preprocess_pb2_grpc.PreprocessStub(channel).ProcessStream()
        written = 0

        async def write() -> None:
            nonlocal written
            for i in itertools.count():
                big = request(f"w{i}")
                big.requests[0].tensors[0].data = bytes(64 * 1024)
                await call.write(big)
                written += 1

        writer = asyncio.ensure_future(write())
        await asyncio.sleep(1.0)
        held = layer.streamed
        writer.cancel()
        call.cancel()
        gate.set()
        await channel.close()
        await server.stop(0)
        return held, written

    held, written = asyncio.run(go())
    assert held == 8
    print(f"held {held}, written {written}")
    assert written < 400  # flow control stopped the writer: at most tens of MiB in buffers


@pytest.fixture
def settings(tmp_path: Path):
    return load_settings(make_config(tmp_path))


def hop_to(address: str, settings, replicated: bool = False) -> Hop:
    """A preprocess hop to `address`; `replicated`: as if behind a target of many replicas
    (a refused message may then go to another one)."""
    target = f"ipv4:{address}" if replicated else None
    update = {"listen": address, "replicas": 1, "target": target}
    endpoint = settings.services.preprocess.model_copy(update=update)
    return open_hop(
        "preprocess",
        endpoint,
        preprocess_pb2_grpc.PreprocessStub,
        "strata.v1.Preprocess",
        settings,
        {"Process": process_stream},
    )


def test_a_hop_sends_on_its_lanes_and_falls_back_to_unary_calls(settings) -> None:
    async def go() -> dict[str, tuple[int, int, bool]]:
        seen = {}
        for name, layer in (("streams", Layer(echo)), ("no streams", Layer(echo, stream=False))):
            server, address = await serve(layer)
            hop = hop_to(address, settings)
            await hop.channel.channel_ready()  # until then, calls go unary and connect it
            for i in range(3):
                reply = await hop.call("Process", request(f"r{i}"), Deadline.after(5))
                assert reply.results[0].id == f"r{i}"
            seen[name] = (layer.streamed, layer.unary, hop.lanes["Process"].usable)
            await hop.channel.close()
            await server.stop(0)
        return seen

    seen = asyncio.run(go())
    assert seen["streams"] == (3, 0, True)
    assert seen["no streams"] == (0, 3, False)  # UNIMPLEMENTED once, unary calls after


def test_a_draining_layer_refuses_new_messages_and_the_hop_sends_them_unary(settings) -> None:
    async def go() -> tuple[int, int]:
        layer = Layer(echo)
        server, address = await serve(layer)
        hop = hop_to(address, settings, replicated=True)
        await hop.channel.channel_ready()
        await hop.call("Process", request("before"), Deadline.after(5))
        Drain.start()
        try:
            reply = await hop.call("Process", request("during"), Deadline.after(5))
        finally:
            Drain.draining = False
        assert reply.results[0].id == "during"
        await hop.channel.close()
        await server.stop(0)
        return layer.streamed, layer.unary

    assert asyncio.run(go()) == (1, 1)


def _ours(context: dict) -> list[str]:
    """The loop's errors but grpc's own poller waking on an empty socket: a process that has
    run several event loops (as this test process has) keeps them all bound to grpc.aio's one
    PollerCompletionQueue, and a loop that loses the wakeup byte to another raises
    BlockingIOError (grpc/grpc#25364). A service runs one loop, so it never sees this."""
    handle = repr(context.get("handle", ""))
    if "PollerCompletionQueue._handle_events" in handle:
        return []
    return [context["message"]]


def test_a_stream_ending_while_a_message_waits_to_be_written_leaves_no_stray_error() -> None:
    """The stream ends (failing what it owes) while a message waits for the writer: the send
    raises LaneBroken, and the answer it owed is not left to be logged as never retrieved."""

    async def scenario() -> list[str]:
        loop = asyncio.get_running_loop()
        stray: list[str] = []
        loop.set_exception_handler(lambda _, context: stray.extend(_ours(context)))
        server, address = await serve(Layer(echo))
        async with grpc.aio.insecure_channel(address) as channel:
            stub = preprocess_pb2_grpc.PreprocessStub(channel)
            lane = Lane(process_stream(stub), expires=loop.time() + 30)
            async with lane._writing:  # another message's write holds the stream
                sending = asyncio.create_task(lane.send(request("a"), 5))
                await asyncio.sleep(0.05)
                lane.cancel()
                await asyncio.sleep(0.05)
            with pytest.raises(LaneBroken):
                await sending
            del sending
            gc.collect()
            await asyncio.sleep(0)
        await server.stop(0)
        return stray

    assert asyncio.run(scenario()) == []


def test_a_message_that_cannot_be_written_in_time_fails_at_its_timeout() -> None:
    """The time limit covers the write too (a stream whose flow control is full, another
    message's write that hangs): the send fails DEADLINE_EXCEEDED at its timeout; and a
    caller's own cancellation of a send is a cancellation still, not a timeout."""

    async def scenario() -> tuple[grpc.StatusCode, float, bool]:
        loop = asyncio.get_running_loop()
        server, address = await serve(Layer(echo))
        async with grpc.aio.insecure_channel(address) as channel:
            stub = preprocess_pb2_grpc.PreprocessStub(channel)
            lane = Lane(process_stream(stub), expires=loop.time() + 30)
            async with lane._writing:  # another message's write holds the stream
                started = loop.time()
                with pytest.raises(grpc.aio.AioRpcError) as late:
                    await asyncio.wait_for(lane.send(request("late"), 0.2), 5)
                waited = loop.time() - started
                sending = asyncio.create_task(lane.send(request("dropped"), 0.2))
                await asyncio.sleep(0.05)
                sending.cancel()
                await asyncio.sleep(0.3)  # past its timeout: the caller's cancel must stand
            cancelled = sending.cancelled()
            answer = await lane.send(request("after"), 5)
            lane.cancel()
        await server.stop(0)
        assert answer.results[0].id == "after"
        return late.value.code(), waited, cancelled

    code, waited, cancelled = asyncio.run(scenario())
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED
    assert 0.15 < waited < 5
    assert cancelled
