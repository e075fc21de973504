"""The gateway's hop spreads flights over a layer's replicas (upstream/lanes.py `Spread`):
two real aio gRPC servers on consecutive loopback ports, the hop open_hop builds for an
endpoint of two replicas, and concurrent calls counted by the replica that answered them.
Each replica gets lanes of its own and each call goes to the one owing the fewest rows, so
neither idles while the other holds a queue: not even when one replica came up late, which
round-robin lanes on one shared channel never noticed until they turned over. A replica is
sent at most gateway.replica_messages at once; the next call goes to the first with room, so
a call (or a big flight's part) never waits on a busy replica while another has room."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.gateway.upstream.hoptime import Load
from services.gateway.upstream.stream_methods import process_stream
from services.gateway.upstream.upstreams import Hop, open_hop
from strata.config import load_settings
from strata.config.endpoints import ServiceEndpoint
from strata.errors import DeadlineExceeded
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire.deadline import Deadline
from tests.service.gateway.test_lanes import Layer, echo
from tests.support.system import free_port, make_config

CALLS = 120
IN_FLIGHT = 8
LEAST_SHARE = 0.35


async def busy(request: v1.ProcessRequest) -> v1.ProcessResponse:
    """Answers after 2 ms a row, as a step thread busy with the flight would."""
    rows = sum(item.tensors[0].shape[0] for item in request.requests)
    await asyncio.sleep(0.002 * rows)
    return await echo(request)


def flight(number: int, rows: int = 4) -> v1.ProcessRequest:
    tensor = v1.Tensor(name="x", datatype="UINT8", shape=[rows], data=bytes(rows))
    return v1.ProcessRequest(requests=[v1.Request(id=f"f{number}", pipeline="p", tensors=[tensor])])


async def start(layer: Layer, address: str) -> grpc.aio.Server:
    # Without SO_REUSEPORT: a server already on `address` makes the bind fail, not share it.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    preprocess_pb2_grpc.add_PreprocessServicer_to_server(layer, server)
    assert server.add_insecure_port(address), f"{address} is taken"
    await server.start()
    return server


def hop_to(settings, listen: str) -> Hop:
    endpoint = ServiceEndpoint(listen=listen, replicas=2)
    stub, service = preprocess_pb2_grpc.PreprocessStub, "strata.v1.Preprocess"
    streams = {"Process": process_stream}
    held = settings.gateway.replica_messages  # as the gateway's preprocess hop
    return open_hop("preprocess", endpoint, stub, service, settings, streams, held=held)


async def replicas(settings, *layers: Layer) -> tuple[list[grpc.aio.Server], Hop]:
    """`layers` served on consecutive loopback ports, and the gateway's hop to them with its
    lanes to every one open."""
    base = free_port(len(layers))
    servers = [await start(layer, f"127.0.0.1:{base + i}") for i, layer in enumerate(layers)]
    hop = hop_to(settings, f"127.0.0.1:{base}")
    await connected(hop)
    return servers, hop


async def stop(hop: Hop, servers: list[grpc.aio.Server]) -> None:
    await hop.close()
    for server in servers:
        await server.stop(0)


def held_until(release: asyncio.Event):
    """A replica's handler that holds every message until `release` is set."""

    async def stuck(request: v1.ProcessRequest) -> v1.ProcessResponse:
        await release.wait()
        return await echo(request)

    return stuck


async def load(hop: Hop) -> None:
    """CALLS flights, IN_FLIGHT at a time, each as the gateway sends a flight's call."""
    numbers = itertools.count()

    async def client() -> None:
        while (number := next(numbers)) < CALLS:
            reply = await hop.call("Process", flight(number), Deadline.after(10))
            assert reply.results[0].id == f"f{number}"

    await asyncio.gather(*(client() for _ in range(IN_FLIGHT)))


def shares(layers: list[Layer]) -> list[float]:
    served = [layer.streamed + layer.unary for layer in layers]
    return [count / sum(served) for count in served]


@pytest.fixture
def settings(tmp_path: Path):
    # The replicas here serve gRPC alone: with pipes on, a lane found another test's stale
    # socket for a reused port, its pipe refused it, and its first messages went unary (seen
    # in make test runs on load), where these tests count messages on lanes.
    return load_settings(make_config(tmp_path, {"server": {"pipes": {"enabled": False}}}))


def test_concurrent_flights_are_spread_over_both_replicas(settings) -> None:
    async def go() -> list[Layer]:
        base = free_port(2)
        layers = [Layer(busy), Layer(busy)]
        servers = [await start(layer, f"127.0.0.1:{base + i}") for i, layer in enumerate(layers)]
        hop = hop_to(settings, f"127.0.0.1:{base}")
        await hop.channel.channel_ready()
        await load(hop)
        await stop(hop, servers)
        return layers

    layers = asyncio.run(go())
    print("shares", shares(layers), "streamed", [layer.streamed for layer in layers])
    assert min(shares(layers)) >= LEAST_SHARE
    assert sum(layer.streamed for layer in layers) >= CALLS * 0.9  # lanes, not unary calls


def test_a_replica_that_comes_up_late_gets_its_share_at_once(settings) -> None:
    """The first replica alone takes the first calls (and its lanes stay open); the second
    starts, and once the gateway's channel to it connects, it takes its share."""

    async def go() -> list[Layer]:
        base = free_port(2)
        layers = [Layer(busy), Layer(busy)]
        first = await start(layers[0], f"127.0.0.1:{base}")
        hop = hop_to(settings, f"127.0.0.1:{base}")
        await hop.channel.channel_ready()
        for number in range(4):
            await hop.call("Process", flight(number), Deadline.after(10))
        second = await start(layers[1], f"127.0.0.1:{base + 1}")
        await connected(hop)
        before = [layer.streamed + layer.unary for layer in layers]
        await load(hop)
        await hop.close()
        await first.stop(0)
        await second.stop(0)
        for layer, count in zip(layers, before, strict=True):
            layer.streamed -= count  # the calls before the second replica was up
        return layers

    layers = asyncio.run(go())
    print("shares after the late start", shares(layers))
    assert min(shares(layers)) >= LEAST_SHARE


async def connected(hop: Hop, within: float = 15.0) -> None:
    """Until the hop's lanes to every replica take messages (the channel to a replica that
    was down tries again after its reconnect backoff)."""
    spread = hop.lanes["Process"]
    async with asyncio.timeout(within):
        while not all(replica.open() for replica in spread.replicas):
            await asyncio.sleep(0.05)


def test_a_slower_replica_gets_fewer_flights_than_a_faster_one(settings) -> None:
    """Each call goes to the replica owing the fewest rows, not to each in turn: one that
    answers in a tenth of the time gets most of the flights. A tenth, not less: the time a
    loaded machine adds to every call, on either replica, narrows the gap."""

    async def slow(request: v1.ProcessRequest) -> v1.ProcessResponse:
        await asyncio.sleep(0.1)
        return await busy(request)

    async def go() -> list[Layer]:
        layers = [Layer(slow), Layer(busy)]
        servers, hop = await replicas(settings, *layers)
        await load(hop)
        await stop(hop, servers)
        return layers

    slower, faster = shares(asyncio.run(go()))
    print(f"slower {slower:.2f}, faster {faster:.2f}")
    assert faster > 0.6


async def members_echo(request: v1.ProcessRequest) -> v1.ProcessResponse:
    """Each member answered with its own rows, as a layer answers a flight."""
    item = request.requests[0]
    result = v1.Result(id=item.id, tensors=item.tensors)
    for member in item.members:
        result.members.add(id=member.id, rows=member.rows)
    return v1.ProcessResponse(results=[result])


def big_flight(rows: int = 8) -> v1.ProcessRequest:
    """A flight of `rows` members, a row of 256 KiB each: 4 rows pass
    gateway.split_flight_bytes (1 MiB)."""
    data = bytes(range(256)) * (rows * 1024)
    tensor = v1.Tensor(name="x", datatype="UINT8", shape=[rows, 262144], data=data)
    item = v1.Request(id="big", pipeline="p", tensors=[tensor])
    for number in range(rows):
        item.members.add(id=f"m{number}", rows=1)
    return v1.ProcessRequest(requests=[item])


async def padded(request: v1.ProcessRequest) -> v1.ProcessResponse:
    """Rows whose width depends on the call (its first member's number, plus one), as a
    tokenizer pads each call to its own longest row: parts' outputs then differ in shape."""
    item = request.requests[0]
    rows, width = len(item.members), int(item.members[0].id[1:]) + 1
    result = v1.Result(id=item.id)
    result.tensors.add(name="y", datatype="UINT8", shape=[rows, width], data=bytes(rows * width))
    for member in item.members:
        result.members.add(id=member.id, rows=member.rows)
    return v1.ProcessResponse(results=[result])


def calls(settings, handler, requests: list[v1.ProcessRequest]):
    """Each of `requests` in turn over a hop to two replicas serving `handler`: the replicas
    (their counts) and the replies."""

    async def go() -> tuple[list[Layer], list[v1.ProcessResponse]]:
        layers = [Layer(handler), Layer(handler)]
        servers, hop = await replicas(settings, *layers)
        replies = [await hop.call("Process", r, Deadline.after(10)) for r in requests]
        await stop(hop, servers)
        return layers, replies

    return asyncio.run(go())


def test_a_big_flight_is_cut_between_the_replicas_and_answered_whole(settings) -> None:
    request = big_flight()
    layers, (reply,) = calls(settings, members_echo, [request])
    assert [layer.streamed for layer in layers] == [1, 1]  # a part each
    (result,) = reply.results
    assert [m.id for m in result.members] == [f"m{n}" for n in range(8)]
    assert list(result.tensors) == list(request.requests[0].tensors)


def test_a_pipeline_whose_parts_answer_in_other_shapes_goes_whole(settings) -> None:
    """The parts' answers cannot be stacked: the flight goes again whole, and the next
    flight of its pipeline goes whole at once."""
    layers, replies = calls(settings, padded, [big_flight(), big_flight()])
    # Two parts, then whole twice; on lanes, or unary where a lane was not ready (a loaded
    # fresh clone's make test sent one so).
    assert sum(layer.streamed + layer.unary for layer in layers) == 2 + 1 + 1
    for reply in replies:
        assert list(reply.results[0].tensors[0].shape) == [8, 1]  # as the whole call answers


def test_a_call_never_waits_on_a_busy_replica_while_the_other_has_room(settings) -> None:
    """The first replica holds every message until released; calls sent meanwhile go to the
    second as it answers, beyond the replica_messages the first was sent."""
    held = settings.gateway.replica_messages

    async def go() -> tuple[list[Layer], list[str]]:
        release = asyncio.Event()
        stuck = held_until(release)
        layers = [Layer(stuck), Layer(echo)]
        servers, hop = await replicas(settings, *layers)
        calls = [
            asyncio.ensure_future(hop.call("Process", flight(number, 1), Deadline.after(10)))
            for number in range(held + 6)
        ]
        done, _ = await asyncio.wait(calls, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        while len(done) < 6 and not release.is_set():
            more, _ = await asyncio.wait(
                [c for c in calls if not c.done()], timeout=10, return_when=asyncio.FIRST_COMPLETED
            )
            assert more, "no call was answered while the first replica held its messages"
            done |= more
        answered = sorted(call.result().results[0].id for call in done)
        holding = [held_messages(replica) for replica in ("0", "1")]
        release.set()
        await asyncio.gather(*calls)
        holding += [held_messages(replica) for replica in ("0", "1")]
        await stop(hop, servers)
        return layers, answered, holding

    layers, answered, holding = asyncio.run(go())
    assert len(answered) == 6  # every call but those the busy replica holds
    assert [layer.streamed for layer in layers] == [held, 6]
    # what the operator sees: the busy replica holding its messages, then none
    assert holding == [held, 0, 0, 0]


def held_messages(replica: str) -> float | None:
    labels = {"hop": "preprocess", "replica": replica}
    return REGISTRY.get_sample_value("strata_gateway_replica_messages", labels)


def test_two_big_flights_parts_go_to_the_replica_with_room(settings) -> None:
    """Two flights of 8 photo-sized members, each cut into 4 parts: the replica that holds
    its first parts takes no more while the other answers the rest of both flights, and each
    flight is answered whole."""
    settings = settings.model_copy(
        update={"gateway": settings.gateway.model_copy(update={"split_flight_bytes": 131072})}
    )
    held = settings.gateway.replica_messages
    parts = 2 * 4

    async def go() -> tuple[list[Layer], list[v1.ProcessResponse]]:
        release = asyncio.Event()
        layers: list[Layer] = []

        async def slow(request: v1.ProcessRequest) -> v1.ProcessResponse:
            if layers[1].streamed < parts - held:  # until the other replica took the rest
                await asyncio.wait_for(release.wait(), 10)
            return await members_echo(request)

        async def fast(request: v1.ProcessRequest) -> v1.ProcessResponse:
            if layers[1].streamed == parts - held:
                release.set()
            return await members_echo(request)

        layers += [Layer(slow), Layer(fast)]
        servers, hop = await replicas(settings, *layers)
        replies = await asyncio.gather(
            *(hop.call("Process", big_flight(), Deadline.after(20)) for _ in range(2))
        )
        await stop(hop, servers)
        return layers, replies

    layers, replies = asyncio.run(go())
    assert [layer.streamed for layer in layers] == [held, parts - held]
    for reply in replies:
        assert [m.id for m in reply.results[0].members] == [f"m{n}" for n in range(8)]


def test_a_call_waiting_for_room_past_its_deadline_fails_and_frees_nothing(settings) -> None:
    """Both replicas hold all they are sent: a further call waits in the gateway, fails with
    DEADLINE_EXCEEDED when its deadline passes (no replica ever sees it), and once the
    replicas answer, calls flow again."""
    held = settings.gateway.replica_messages

    async def go() -> list[Layer]:
        release = asyncio.Event()
        stuck = held_until(release)
        layers = [Layer(stuck), Layer(stuck)]
        servers, hop = await replicas(settings, *layers)
        holding = [
            asyncio.ensure_future(hop.call("Process", flight(number, 1), Deadline.after(20)))
            for number in range(2 * held)
        ]
        async with asyncio.timeout(10):
            while sum(layer.streamed for layer in layers) < 2 * held:
                await asyncio.sleep(0.01)
        with pytest.raises(DeadlineExceeded):
            await hop.call("Process", flight(99, 1), Deadline.after(0.5))
        release.set()
        await asyncio.gather(*holding)
        await load(hop)
        await stop(hop, servers)
        return layers

    layers = asyncio.run(go())
    assert sum(layer.streamed + layer.unary for layer in layers) == 2 * held + CALLS


def test_a_call_cancelled_while_waiting_for_room_takes_no_place(settings) -> None:
    """A caller that gives up while its call waits in the gateway leaves every replica's
    places as they were: once the replicas answer, each again takes replica_messages at once."""
    held = settings.gateway.replica_messages

    async def go() -> None:
        base = free_port(2)
        gates = [asyncio.Event()]

        async def stuck(request: v1.ProcessRequest) -> v1.ProcessResponse:
            await gates[-1].wait()
            return await echo(request)

        layers = [Layer(stuck), Layer(stuck)]
        servers = [await start(layer, f"127.0.0.1:{base + i}") for i, layer in enumerate(layers)]
        hop = hop_to(settings, f"127.0.0.1:{base}")
        await connected(hop)
        for _ in range(2):  # the second time, after a waiting call was cancelled
            sent = sum(layer.streamed for layer in layers)
            holding = [
                asyncio.ensure_future(hop.call("Process", flight(n, 1), Deadline.after(20)))
                for n in range(2 * held)
            ]
            async with asyncio.timeout(10):  # every place taken, none lost
                while sum(layer.streamed for layer in layers) < sent + 2 * held:
                    await asyncio.sleep(0.01)
            waiting = asyncio.ensure_future(hop.call("Process", flight(99, 1), Deadline.after(20)))
            await asyncio.sleep(0.1)
            waiting.cancel()
            gates[-1].set()
            await asyncio.gather(*holding)
            gates.append(asyncio.Event())
        gates[-1].set()
        await stop(hop, servers)

    asyncio.run(go())


def test_a_wait_for_a_replica_with_room_is_not_timed_as_the_replicas_own(settings) -> None:
    """Sixteen calls at once for four places: most wait in the gateway before they are sent,
    and the hop's timer, which sets its timeouts from the replicas' recent P99, reads what
    the replicas took, not that wait (else a queue in the gateway would stretch every
    timeout, and a hung replica would hold its calls that much longer)."""

    async def slow(request: v1.ProcessRequest) -> v1.ProcessResponse:
        await asyncio.sleep(0.03)
        return await echo(request)

    async def go() -> tuple[float, float]:
        layers = [Layer(slow), Layer(slow)]
        servers, hop = await replicas(settings, *layers)
        seconds = []

        async def timed(number: int) -> None:
            started = asyncio.get_running_loop().time()
            await hop.call("Process", flight(number, 1), Deadline.after(10))
            seconds.append(asyncio.get_running_loop().time() - started)

        for wave in range(4):
            await asyncio.gather(*(timed(wave * 16 + i) for i in range(16)))
        usual = hop.timer.begin(Load.of(flight(0, 1))).usual
        await stop(hop, servers)
        return usual, float(np.percentile(seconds, 99))

    usual, waited = asyncio.run(go())
    assert settings.gateway.replica_messages * 2 < 16, "calls wait for room"
    assert 0 < usual < 0.6 * waited, (usual, waited)
