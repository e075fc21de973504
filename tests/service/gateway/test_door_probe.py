"""The gateway's door probe on a real grpc.aio server: a health check through a Unix socket of
the server's own waits behind the calls queued before the door, and only behind them."""

from __future__ import annotations

import asyncio
import threading
import time

import grpc

from services.gateway.door.backlog import Backlog
from services.gateway.door.ladder import Signals
from services.gateway.door.probe import DoorProbe
from strata.config.server import ServerSettings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.rpc.server import start_server

FLOOD = 200  # calls sent at once, each holding the event loop for HELD seconds
HELD = 0.005


class Slow(v2_grpc.GRPCInferenceServiceServicer):
    """ServerLive holds the event loop a little, as a handler's Python does."""

    def __init__(self) -> None:
        self.started = threading.Event()

    async def ServerLive(self, request, context) -> v2.ServerLiveResponse:
        self.started.set()
        time.sleep(HELD)
        return v2.ServerLiveResponse(live=True)


def flood(port: int, sent: threading.Event) -> threading.Thread:
    """A thread sending FLOOD calls at once on one connection (`sent` once they are all on
    their way), then waiting for them all."""

    def send() -> None:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            live = v2_grpc.GRPCInferenceServiceStub(channel).ServerLive
            calls = [live.future(v2.ServerLiveRequest(), timeout=60) for _ in range(FLOOD)]
            sent.set()
            for call in calls:
                call.result()

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def test_the_probe_waits_behind_the_calls_queued_at_the_door_and_no_longer() -> None:
    signals = Signals()
    servicer = Slow()
    add = v2_grpc.add_GRPCInferenceServiceServicer_to_server
    registration = (servicer, add, v2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name)

    async def go() -> list[float]:
        probe = DoorProbe(signals, Backlog(lambda: 0.0), lambda: 0.05)
        running = await start_server(
            [registration], "127.0.0.1:0", ServerSettings(), public=True, private=probe.address
        )
        try:
            sent = threading.Event()
            sender = flood(running.port, sent)
            while not (sent.is_set() and servicer.started.is_set()):
                await asyncio.sleep(0.001)
            probe.start()  # its first check joins the queue behind the flood
            while sender.is_alive():
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.5)  # the door is empty again
            return [seconds for slot in signals.recent(60) for seconds in slot.door_probes]
        finally:
            await probe.close()
            await running.server.stop(0)

    waits = asyncio.run(go())
    # The flood holds the loop FLOOD x HELD = 1 s: a probe sent into it waited behind most of
    # it; once it is over, probes pass at once.
    assert max(waits) > 0.25 * FLOOD * HELD
    assert min(waits[-3:]) < 0.1
