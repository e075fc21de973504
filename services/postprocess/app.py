"""Builds the postprocess service from the config."""

from __future__ import annotations

from services.postprocess.engine import RuleEngine, build_chain
from services.postprocess.servicer import PostprocessServicer
from strata.cli import Service
from strata.config import Settings
from strata.proto.v1 import postprocess_pb2, postprocess_pb2_grpc


async def build(settings: Settings) -> Service:
    engine = RuleEngine(
        {
            name: build_chain(name, spec, settings.repository)
            for name, spec in settings.pipelines.items()
        }
    )
    name = postprocess_pb2.DESCRIPTOR.services_by_name["Postprocess"].full_name
    servicer = PostprocessServicer(engine)
    return Service(
        registrations=[(servicer, postprocess_pb2_grpc.add_PostprocessServicer_to_server, name)],
        endpoint=settings.services.postprocess,
    )
