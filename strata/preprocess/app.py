"""Builds the preprocess service from the config."""

from __future__ import annotations

from strata import limits
from strata.cli import Service
from strata.config import Settings
from strata.preprocess.metrics import StepTimings
from strata.preprocess.pipeline import Pipelines, build_pipeline
from strata.preprocess.servicer import PreprocessServicer
from strata.proto.v1 import preprocess_pb2, preprocess_pb2_grpc


def build_pipelines(settings: Settings, timings: StepTimings) -> Pipelines:
    """Every pipeline's steps, built once; a config mistake raises ValueError naming it."""
    return Pipelines(
        {
            name: build_pipeline(name, spec, settings.repository, timings)
            for name, spec in settings.pipelines.items()
        }
    )


async def build(settings: Settings) -> Service:
    limits.install(settings.limits.plain())
    timings = StepTimings()
    servicer = PreprocessServicer(
        build_pipelines(settings, timings),
        settings.preprocess.inline_max_bytes,
        settings.server.max_stream_in_flight,
    )
    name = preprocess_pb2.DESCRIPTOR.services_by_name["Preprocess"].full_name
    return Service(
        registrations=[(servicer, preprocess_pb2_grpc.add_PreprocessServicer_to_server, name)],
        endpoint=settings.services.preprocess,
    )
