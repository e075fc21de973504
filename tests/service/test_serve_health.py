"""A server says SERVING only once every port it serves listens: a caller told SERVING (the
launcher, a probe, a load balancer) must find the REST port open too, not refused."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.config.server import ServerSettings
from strata.rpc.server import serve
from tests.support.system import free_port


class Started(Exception):
    """The companion's way to end the server once it has looked."""


class Witness:
    """A companion (as the gateway's REST server is) that asks the gRPC server's health while
    it is itself still starting."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.seen: int | None = None

    async def start(self) -> None:
        async with grpc.aio.insecure_channel(self.address) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        self.seen = reply.status
        raise Started

    async def stop(self, grace: float) -> None:
        return None


def test_health_is_not_serving_until_every_companion_listens() -> None:
    address = f"127.0.0.1:{free_port()}"
    witness = Witness(address)
    with pytest.raises(Started):
        asyncio.run(serve([], address, ServerSettings(), companions=[witness]))
    assert witness.seen == health_pb2.HealthCheckResponse.NOT_SERVING
