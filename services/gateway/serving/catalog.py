"""The pipelines a client can name, as v2 models: their names, metadata, model configuration
and statistics, from the settings in force (a reload swaps them whole)."""

from __future__ import annotations

from services.gateway.flow.statistics import STATISTICS
from services.gateway.runtime import Runtime
from strata import __version__
from strata.config.pipelines import Pipeline
from strata.errors import NotFound, listed, shown
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire.v2meta import metadata_response, model_config

PLATFORM = "strata_pipeline"
SERVER_NAME = "strata"
PIPELINE_VERSION = "1"
EXTENSIONS = [
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "sequence",
    "sequence(string_id)",
    "statistics",
    "system_shared_memory",
]


class Catalog:
    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def names(self) -> list[str]:
        return sorted(self._runtime.settings.pipelines)

    def has(self, name: str) -> bool:
        return name in self._runtime.settings.pipelines

    def get(self, name: str, version: str = "") -> Pipeline | None:
        """The pipeline `name` at `version` ("" or the pipeline's own), None if none."""
        if version not in ("", PIPELINE_VERSION):
            return None
        return self._runtime.settings.pipelines.get(name)

    def pipeline(self, name: str, version: str = "") -> Pipeline:
        """The pipeline `name` (at `version`, when given); NOT_FOUND naming what exists."""
        pipeline = self._runtime.settings.pipelines.get(name)
        if pipeline is None:
            raise NotFound(f"unknown model {shown(name)}; pipelines: {listed(self.names())}")
        if version not in ("", PIPELINE_VERSION):
            raise NotFound(f"model {shown(name)} has no version {shown(version)}")
        return pipeline

    def server_metadata(self) -> v2.ServerMetadataResponse:
        return v2.ServerMetadataResponse(
            name=SERVER_NAME, version=__version__, extensions=EXTENSIONS
        )

    def model_metadata(self, name: str, version: str = "") -> v2.ModelMetadataResponse:
        pipeline = self.pipeline(name, version)
        return metadata_response(
            name, [PIPELINE_VERSION], PLATFORM, pipeline.inputs, pipeline.outputs
        )

    def model_config(self, name: str, version: str = "") -> v2.ModelConfigResponse:
        pipeline = self.pipeline(name, version)
        batch = pipeline.max_batch_size if pipeline.batched else 0
        return model_config(
            name,
            PLATFORM,
            batch,
            pipeline.inputs,
            pipeline.outputs,
            pipeline.sequence,
            decoupled=pipeline.decoupled is not None,
        )

    def model_statistics(self, name: str = "", version: str = "") -> v2.ModelStatisticsResponse:
        """Each pipeline's numbers (services/gateway/flow/statistics.py); all with no name.
        With a version one of its arms serves, one entry of that model version's numbers, as
        Triton answers per version; with none (or the pipeline's own "1", where no arm serves
        a version 1), the pipeline's whole numbers."""
        if not name:
            names = self.names()
            return v2.ModelStatisticsResponse(
                model_stats=[STATISTICS.model_statistics(each, PIPELINE_VERSION) for each in names]
            )
        pipeline = self.pipeline(name)
        served = self._versions_served(name, pipeline)
        if version in served:
            entry = STATISTICS.model_statistics(name, version, model_version=version)
        elif version in ("", PIPELINE_VERSION):
            entry = STATISTICS.model_statistics(name, PIPELINE_VERSION)
        else:
            raise NotFound(
                f"model {shown(name)} has no version {shown(version)}; its arms serve "
                f"versions: {listed(served)}"
            )
        return v2.ModelStatisticsResponse(model_stats=[entry])

    def _versions_served(self, name: str, pipeline: Pipeline) -> list[str]:
        """The model versions pipeline `name`'s arms name, and any that have answered it (an
        arm that names none serves whichever its deployment has)."""
        routes = self._runtime.router(name).routes
        named = {route.version or pipeline.model.version for route in routes}
        return sorted((named | set(STATISTICS.versions(name))) - {""})
