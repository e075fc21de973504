"""Builds the inference service of one deployment: every model it loads (those its routes
name, or inference.models) loaded, validated and warmed first."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from services.inference import metrics
from services.inference.manager import ModelManager
from services.inference.rewiring import Rewiring
from services.inference.servicer import InferenceServicer
from services.inference.slabs import SlabInputs
from strata.config import Settings
from strata.errors import StrataError
from strata.process.exits import ModelUnusable
from strata.proto.inference import grpc_service_pb2, grpc_service_pb2_grpc
from strata.rpc.main import Service
from strata.shapes import folding
from strata.wire import limits


async def build(settings: Settings) -> Service:
    """The servicer over a model manager that has loaded every model its deployment loads."""
    limits.install(settings.limits.plain())
    deployment = settings.deployment
    inference = settings.inference.model_copy(update={"models": settings.models_of(deployment)})
    executor = ThreadPoolExecutor(max_workers=inference.workers, thread_name_prefix="onnxruntime")
    rewiring = Rewiring(settings.pipelines)
    folds = folding.model_folds(settings.pipelines)
    models = ModelManager(settings.repository, inference, executor, rewiring, folds)
    try:
        await models.start()
    except BaseException as exc:
        await models.close()
        executor.shutdown(wait=False)
        if isinstance(exc, StrataError):  # its message names the model, not the repository
            raise ModelUnusable(f"repository {settings.repository}: {exc}") from None
        raise
    servicer = InferenceServicer(
        models,
        inference,
        settings.server.max_stream_in_flight,
        settings.gateway.local_model_control,
        SlabInputs(settings.server.slab) if settings.server.slab.enabled else None,
    )
    unwatch = metrics.watch(models.statistics, deployment)
    name = grpc_service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name

    async def on_stop() -> None:
        unwatch()
        await models.close()
        executor.shutdown(wait=True)

    return Service(
        registrations=[
            (servicer, grpc_service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server, name)
        ],
        endpoint=settings.services.inference[deployment],
        on_stop=on_stop,
        on_start=servicer.report_health,
    )
