"""Builds the preprocess service from the config."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor

from services.preprocess.metrics import StepTimings
from services.preprocess.pipeline import PreprocessPipelines, Versions, build_pipeline
from services.preprocess.servicer import PreprocessServicer
from services.preprocess.threads import step_pool
from services.preprocess.versions import VersionedPipeline
from strata.config import Settings
from strata.config.preprocess import per_version
from strata.proto.v1 import preprocess_pb2, preprocess_pb2_grpc
from strata.rpc.main import Service
from strata.shapes import folding
from strata.wire import limits
from strata.wire.slab import Slab, Slabs, open_slab


def build_pipelines(settings: Settings, timings: StepTimings) -> PreprocessPipelines:
    """Every pipeline's steps, built once (per model version its routes call, for those fed
    per version), less the tail a folding pipeline leaves to its model; a config mistake
    raises ValueError naming it."""
    built: dict[str, Versions] = {}
    folds = folding.folds(settings.pipelines)
    for name, spec in settings.pipelines.items():
        if not per_version(spec.preprocess):
            fold = folds.get(name)
            steps = fold.steps if fold is not None else 0
            built[name] = build_pipeline(name, spec, settings.repository, timings, steps)
            continue
        check = settings.preprocess.version_check_seconds
        versioned = VersionedPipeline(name, spec, settings.repository, timings, check)
        versioned.build_all(dict.fromkeys(spec.model.versions_called()))
        built[name] = versioned
    return PreprocessPipelines(built)


async def build(settings: Settings) -> Service:
    limits.install(settings.limits.plain())
    timings = StepTimings()
    steps = step_pool(settings.preprocess.threads)  # before any step starts a native pool
    slab = open_slab(settings.server.slab, "preprocess")
    servicer = PreprocessServicer(
        build_pipelines(settings, timings),
        steps,
        settings.preprocess.inline_max_bytes,
        settings.server.max_stream_in_flight,
        slab,
        Slabs(settings.server.slab.root) if slab is not None else None,
    )
    name = preprocess_pb2.DESCRIPTOR.services_by_name["Preprocess"].full_name
    return Service(
        registrations=[(servicer, preprocess_pb2_grpc.add_PreprocessServicer_to_server, name)],
        endpoint=settings.services.preprocess,
        on_stop=lambda: asyncio.to_thread(_stop, steps, slab),
    )


def _stop(steps: Executor, slab: Slab | None) -> None:
    steps.shutdown()
    if slab is not None:
        slab.close()
