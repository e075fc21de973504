"""Builds the postprocess service from the config."""

from __future__ import annotations

from services.postprocess.engine import RuleEngine
from services.postprocess.rule_chain import build_chain
from services.postprocess.servicer import PostprocessServicer
from strata.config import Settings
from strata.proto.v1 import postprocess_pb2, postprocess_pb2_grpc
from strata.rpc.main import Service
from strata.wire import limits


def build_engine(settings: Settings) -> RuleEngine:
    """Every pipeline's rules, built once; a config mistake raises ValueError naming it."""
    chains = {
        name: build_chain(name, spec, settings.repository, settings.postprocess)
        for name, spec in settings.pipelines.items()
    }
    return RuleEngine(chains, settings.postprocess)


async def build(settings: Settings) -> Service:
    limits.install(settings.limits.plain())
    engine = build_engine(settings)
    name = postprocess_pb2.DESCRIPTOR.services_by_name["Postprocess"].full_name
    servicer = PostprocessServicer(engine, settings.server.max_stream_in_flight)
    return Service(
        registrations=[(servicer, postprocess_pb2_grpc.add_PostprocessServicer_to_server, name)],
        endpoint=settings.services.postprocess,
        on_stop=engine.close,
    )
