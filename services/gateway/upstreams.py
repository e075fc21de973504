"""The gateway's channels to the layers behind it, each guarded by a circuit breaker.

Every call passes on what is left of the caller's deadline; every failure comes back as the
upstream's own status code with the hop named in the message. gRPC's retry policy (in the
channel's service config) retries UNAVAILABLE on another replica; the breaker sees only what
is left after those retries. Trace context goes in each call's metadata, and a client span
is made only when the call's trace is sampled (strata.telemetry.outgoing).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.breaker import CircuitBreaker
from services.gateway.metrics import BREAKER_OPEN, UPSTREAM_CALLS
from strata.channels import open_channel
from strata.config import ServiceEndpoint, Settings
from strata.errors import Unavailable, from_code
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.telemetry import outgoing

INFERENCE_SERVICE = "inference.GRPCInferenceService"


class Hop:
    """One upstream: a traced channel with retries, a stub, and a circuit breaker."""

    def __init__(
        self, name: str, endpoint: ServiceEndpoint, stub: type, service: str, settings: Settings
    ) -> None:
        self.name = name
        self.channel = open_channel(endpoint.address, settings.server, [service], settings.tls)
        self.stub = stub(self.channel)
        self.breaker = CircuitBreaker(name, settings.gateway.breaker)
        self.timeout = settings.gateway.upstream_timeout_seconds

    async def call(self, method: str, request: Any, budget: float, metadata: Sequence = ()) -> Any:
        """Call `method` within the caller's remaining budget and this hop's own timeout.

        Running out of the caller's budget says nothing about the upstream; missing the hop's
        own timeout does: it counts against the breaker and is UNAVAILABLE (retry elsewhere).
        """
        if not self.breaker.allow():
            UPSTREAM_CALLS(self.name, "CIRCUIT_OPEN").inc()
            raise Unavailable(f"{self.name}: circuit open after repeated failures")
        with outgoing(f"{self.name} {method}", metadata) as sent:
            return await self._call(method, request, budget, sent)

    async def _call(self, method: str, request: Any, budget: float, metadata: Sequence) -> Any:
        hop_bound = self.timeout < budget
        code = grpc.StatusCode.CANCELLED
        try:
            reply = await getattr(self.stub, method)(
                request, timeout=min(budget, self.timeout), metadata=metadata
            )
            code = grpc.StatusCode.OK
            return reply
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED and hop_bound:
                code = grpc.StatusCode.UNAVAILABLE
                raise Unavailable(f"{self.name}: no answer within {self.timeout:g}s") from None
            if code == grpc.StatusCode.CANCELLED:
                # Our caller did not cancel (that would cancel this task instead): the upstream
                # dropped the call, e.g. while shutting down. Another replica or arm may answer.
                code = grpc.StatusCode.UNAVAILABLE
                raise Unavailable(f"{self.name}: the call was dropped ({exc.details()})") from None
            raise from_code(code, f"{self.name}: {exc.details()}") from None
        finally:
            self.breaker.record(code)
            UPSTREAM_CALLS(self.name, code.name).inc()
            BREAKER_OPEN(self.name).set(self.breaker.state == "open")

    async def healthy(self, timeout: float) -> bool:
        stub = health_pb2_grpc.HealthStub(self.channel)
        try:
            reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.aio.AioRpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


class Upstreams:
    """Preprocess, every inference deployment, and postprocess."""

    def __init__(self, settings: Settings) -> None:
        services = settings.services
        self.preprocess = Hop(
            "preprocess",
            services.preprocess,
            preprocess_pb2_grpc.PreprocessStub,
            "strata.v1.Preprocess",
            settings,
        )
        self.postprocess = Hop(
            "postprocess",
            services.postprocess,
            postprocess_pb2_grpc.PostprocessStub,
            "strata.v1.Postprocess",
            settings,
        )
        self.inference = {
            name: Hop(
                f"inference-{name}",
                endpoint,
                v2_grpc.GRPCInferenceServiceStub,
                INFERENCE_SERVICE,
                settings,
            )
            for name, endpoint in services.inference.items()
        }

    @property
    def hops(self) -> list[Hop]:
        return [self.preprocess, *self.inference.values(), self.postprocess]

    async def healthy(self, timeout: float = 1.0) -> dict[str, bool]:
        """Whether each upstream's health service answers SERVING."""
        states = await asyncio.gather(*(hop.healthy(timeout) for hop in self.hops))
        return {hop.name: state for hop, state in zip(self.hops, states, strict=True)}

    async def close(self) -> None:
        for hop in self.hops:
            await hop.channel.close()
