"""The gateway's channels and stubs to the three layers behind it.

Every call passes on what is left of the caller's deadline, and every failure comes back as
the upstream's own status code with the hop named in the message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from strata.channels import open_channel
from strata.config import Settings
from strata.errors import Upstream
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc

R = TypeVar("R")
HOPS = ("preprocess", "inference", "postprocess")


class Upstreams:
    """Stubs to preprocess, inference and postprocess, over traced channels with retries."""

    def __init__(self, settings: Settings) -> None:
        services = settings.services
        self._channels = {
            "preprocess": open_channel(
                services.preprocess.address, settings.server, ["strata.v1.Preprocess"]
            ),
            "inference": open_channel(
                services.primary_inference.address,
                settings.server,
                ["inference.GRPCInferenceService"],
            ),
            "postprocess": open_channel(
                services.postprocess.address, settings.server, ["strata.v1.Postprocess"]
            ),
        }
        self.preprocess = preprocess_pb2_grpc.PreprocessStub(self._channels["preprocess"])
        self.inference = v2_grpc.GRPCInferenceServiceStub(self._channels["inference"])
        self.postprocess = postprocess_pb2_grpc.PostprocessStub(self._channels["postprocess"])

    async def healthy(self, timeout: float = 1.0) -> dict[str, bool]:
        """Whether each layer's health service answers SERVING."""
        states = {}
        for hop, channel in self._channels.items():
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
                states[hop] = reply.status == health_pb2.HealthCheckResponse.SERVING
            except grpc.aio.AioRpcError:
                states[hop] = False
        return states

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()


async def call(hop: str, rpc: Callable[..., Awaitable[R]], request: object, timeout: float) -> R:
    """Call one upstream RPC with the remaining budget; failures name the hop."""
    try:
        return await rpc(request, timeout=timeout)
    except grpc.aio.AioRpcError as exc:
        raise Upstream(exc.code(), f"{hop}: {exc.details()}") from None
