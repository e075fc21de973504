"""Builds the gateway: the public v2 endpoint (gRPC, and REST where configured) in front of
the layers, and its admin API."""

from __future__ import annotations

from services.gateway.admin import AdminServicer
from services.gateway.pipelines import Pipelines
from services.gateway.rest.app import build_app
from services.gateway.rest.server import RestServer
from services.gateway.runtime import Runtime
from services.gateway.servicer import GatewayServicer
from strata import limits
from strata.cli import Service
from strata.config import Settings
from strata.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc


async def build(settings: Settings) -> Service:
    limits.install(settings.limits.plain())
    runtime = Runtime(settings)
    runtime.start()
    pipelines = Pipelines(runtime)
    v2_name = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    registrations = [
        (
            GatewayServicer(pipelines, settings.server.max_stream_in_flight),
            grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server,
            v2_name,
        )
    ]
    token = settings.gateway.admin_token
    if token is not None:
        admin_name = admin_pb2.DESCRIPTOR.services_by_name["Admin"].full_name
        admin = AdminServicer(runtime, token.get_secret_value())
        registrations.append((admin, admin_pb2_grpc.add_AdminServicer_to_server, admin_name))
    endpoint = settings.services.gateway
    companions = []
    if endpoint.rest is not None:
        app = build_app(pipelines, settings.gateway.rest)
        companions.append(RestServer(app, endpoint.rest, settings.server, settings.tls, "gateway"))
    return Service(
        registrations=registrations,
        endpoint=endpoint,
        on_stop=runtime.close,
        public=True,
        companions=companions,
    )
