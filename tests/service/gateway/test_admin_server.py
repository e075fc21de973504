"""The gateway's admin server on a port of its own drains as the public one does: its
health turns NOT_SERVING for those watching it before it stops."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.app import AdminServer
from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import free_port, make_config

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
ANY_SERVICE = (
    v2_grpc.GRPCInferenceServiceServicer(),
    v2_grpc.add_GRPCInferenceServiceServicer_to_server,
    "inference.GRPCInferenceService",
)


def test_the_admin_servers_health_turns_not_serving_before_it_stops(tmp_path: Path) -> None:
    settings = load_settings(make_config(tmp_path))

    async def scenario() -> list[int]:
        server = AdminServer(ANY_SERVICE, f"127.0.0.1:{free_port()}", settings)
        await server.start()
        async with grpc.aio.insecure_channel(server.listen) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest())
            seen = [(await watch.read()).status]
            stopping = asyncio.create_task(server.stop(1.0))
            seen.append((await watch.read()).status)
            await stopping
        return seen

    assert asyncio.run(scenario()) == [SERVING, NOT_SERVING]
