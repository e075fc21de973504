"""Builds the preprocess service from the config."""

from __future__ import annotations

from services.preprocess.pipeline import Pipelines, build_pipeline
from services.preprocess.servicer import PreprocessServicer
from strata.cli import Service
from strata.config import Settings
from strata.proto.v1 import preprocess_pb2, preprocess_pb2_grpc


async def build(settings: Settings) -> Service:
    pipelines = Pipelines(
        {
            name: build_pipeline(name, spec, settings.repository)
            for name, spec in settings.pipelines.items()
        }
    )
    name = preprocess_pb2.DESCRIPTOR.services_by_name["Preprocess"].full_name
    servicer = PreprocessServicer(pipelines)
    return Service(
        registrations=[(servicer, preprocess_pb2_grpc.add_PreprocessServicer_to_server, name)],
        endpoint=settings.services.preprocess,
    )
