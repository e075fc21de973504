"""Builds the gateway: the public v2 endpoint in front of the three layers."""

from __future__ import annotations

from services.gateway.servicer import GatewayServicer
from services.gateway.upstreams import Upstreams
from strata.cli import Service
from strata.config import Settings
from strata.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc


async def build(settings: Settings) -> Service:
    upstreams = Upstreams(settings)
    servicer = GatewayServicer(settings, upstreams)
    name = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    return Service(
        registrations=[
            (servicer, grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, name)
        ],
        endpoint=settings.services.gateway,
        on_stop=upstreams.close,
    )
