"""The deployment's one YAML file, typed and validated at load time.

Every service reads the same file and uses its own section. Environment variables prefixed
`STRATA_` override the file (nested keys joined by `__`, e.g.
`STRATA_SERVICES__GATEWAY__LISTEN=0.0.0.0:8001`), so containers need no edited copy.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import Field, PrivateAttr, ValidationError, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from strata import yamltext
from strata.config.base import PluginStage, loopback
from strata.config.endpoints import Services
from strata.config.gateway import GatewaySettings
from strata.config.inference import InferenceSettings
from strata.config.limits import TensorLimits
from strata.config.pipelines import ModelRef, Pipeline, Route, Shadow
from strata.config.postprocess import PostprocessSettings
from strata.config.preprocess import VERSION, PreprocessSettings, per_version
from strata.config.server import ServerSettings, TelemetrySettings
from strata.config.tls import TlsSettings
from strata.registry import PluginError, dotted

SECRET_SECTIONS = ("gateway", "inference")  # sections with `*_file` secrets (`with_files`)
# The services that build a pipeline section's stages, so load their plugins (user code).
STAGE_SECTIONS = ("preprocess", "postprocess")


class ConfigError(ValueError):
    """The config file is missing, unreadable or invalid; the message says where."""


class Settings(BaseSettings):
    """The whole deployment."""

    model_config = SettingsConfigDict(
        env_prefix="STRATA_", env_nested_delimiter="__", extra="forbid"
    )
    # The file these settings came from, so a running service can reload it.
    _source: Path | None = PrivateAttr(default=None)
    # The inference deployment an inference process serves (see `deployment`).
    _deployment: str = PrivateAttr(default="")

    services: Services = Field(description="Where each layer listens.")
    server: ServerSettings = Field(
        default_factory=ServerSettings, description="Shared server behaviour."
    )
    tls: TlsSettings = Field(default_factory=TlsSettings, description="TLS on every hop.")
    telemetry: TelemetrySettings = Field(
        default_factory=TelemetrySettings, description="Tracing and logs."
    )
    repository: Path = Field(description="Model repository folder (relative to the config file).")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="Policies.")
    inference: InferenceSettings = Field(
        default_factory=InferenceSettings, description="Models the inference service serves."
    )
    preprocess: PreprocessSettings = Field(
        default_factory=PreprocessSettings, description="Where the steps run."
    )
    postprocess: PostprocessSettings = Field(
        default_factory=PostprocessSettings, description="Rule time limits and threads."
    )
    limits: TensorLimits = Field(
        default_factory=TensorLimits,
        description="What one tensor may declare (rank, dimensions, elements, bytes), checked "
        "on every port of every layer before anything is allocated.",
    )
    pipelines: dict[str, Pipeline] = Field(min_length=1, description="Pipelines by name.")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return env_settings, init_settings

    @model_validator(mode="after")
    def _pipelines_use_served_models(self) -> Settings:
        deployments = sorted(self.services.inference)
        if isinstance(self.inference.models, dict):
            unknown = sorted(set(self.inference.models) - set(deployments))
            if unknown:
                raise ValueError(
                    f"inference.models names deployment {unknown[0]!r}, not one of "
                    f"services.inference: {deployments}"
                )
        for name in self.pipelines:
            for model, route in self._called(name):
                if route.deployment not in self.services.inference:
                    raise ValueError(
                        f"pipeline {name!r} routes to deployment {route.deployment!r}, "
                        f"not one of services.inference: {deployments}"
                    )
                if model not in self.models_of(route.deployment):
                    raise ValueError(
                        f"pipeline {name!r} routes to deployment {route.deployment!r}, which "
                        f"does not load model {model!r} (inference.models)"
                    )
        return self

    @model_validator(mode="after")
    def _local_model_control_on_loopback_only(self) -> Settings:
        """Tokenless model control only where no other host can reach it."""
        if not self.gateway.local_model_control:
            return self
        services = self.services
        listeners = {
            "services.gateway.listen": [services.gateway.listen],
            "services.gateway.rest": [services.gateway.rest] if services.gateway.rest else [],
            **{f"services.inference.{n}": e.listens for n, e in services.inference.items()},
        }
        for setting, addresses in listeners.items():
            for address in addresses:
                if not loopback(address):
                    raise ValueError(
                        f"gateway.local_model_control lets anyone who reaches the gateway or "
                        f"an inference deployment load and unload models without a token, so "
                        f"it needs every such listener on a loopback address; {setting} is "
                        f"{address!r}: bind it to 127.0.0.1, or turn local_model_control off "
                        "and use the admin tokens"
                    )
        return self

    @model_validator(mode="after")
    def _versioned_preprocessing_knows_the_version(self) -> Settings:
        """Preprocess learns the version from the request's arm; a pipeline that reads files
        per version needs every arm to name one, and its shadow (fed the inputs prepared for
        the request's arm) to call the version every arm calls."""
        for name, pipeline in self.pipelines.items():
            if not per_version(pipeline.preprocess):
                continue
            called = pipeline.model.versions_called()
            if "" in called:
                raise ValueError(
                    f"pipeline {name!r} reads preprocess files per model version ({VERSION}): "
                    "every route must name its version (the route's version or model.version)"
                )
            if pipeline.model.shadow is not None and len(set(called)) > 1:
                raise ValueError(
                    f"pipeline {name!r} reads preprocess files per model version ({VERSION}): "
                    "its shadow gets the inputs prepared for the request's arm, so it must "
                    f"call the version every route calls (they call {sorted(set(called))})"
                )
        return self

    @property
    def source(self) -> Path | None:
        """The config file these settings were loaded from."""
        return self._source

    @property
    def deployment(self) -> str:
        """The inference deployment this process serves (load_settings' `listen`; the first
        when it names none)."""
        return self._deployment or next(iter(self.services.inference))

    def as_deployment(self, deployment: str) -> Settings:
        """These settings as an inference process serving `deployment` has them."""
        copy = self.model_copy()
        copy._deployment = deployment
        return copy

    def deployment_at(self, listen: str) -> str:
        """The inference deployment one of whose replicas listens on `listen` ("" if none)."""
        found = (d for d, endpoint in self.services.inference.items() if listen in endpoint.listens)
        return next(found, "")

    def models_of(self, deployment: str) -> list[str]:
        """The models inference deployment `deployment` loads (inference.models)."""
        routed = [
            model
            for name in self.pipelines
            for model, route in self._called(name)
            if route.deployment == deployment
        ]
        return self.inference.loads(deployment, list(dict.fromkeys(routed)))

    def _called(self, pipeline: str) -> list[tuple[str, Route | Shadow]]:
        """Each model `pipeline` runs (its first, its later stages' and their fallbacks',
        docs/pipelines.md) with each route and shadow that calls it."""
        return [
            (model.name, route)
            for model in self.pipelines[pipeline].model_refs()
            for route in self.model_routes(model) + ([model.shadow] if model.shadow else [])
        ]

    def routes(self, pipeline: str) -> list[Route]:
        """A pipeline's arms; with none configured, one arm on the first deployment."""
        return self.model_routes(self.pipelines[pipeline].model)

    def model_routes(self, model: ModelRef) -> list[Route]:
        """A model's arms (a pipeline's or a stage's); with none configured, one arm on the
        first deployment."""
        if model.routes:
            return model.routes
        first = next(iter(self.services.inference))
        return [Route(arm=first, deployment=first, version=model.version)]


def load_settings(path: Path, service: str | None = None, listen: str | None = None) -> Settings:
    """Read and validate the config file; relative paths resolve against its folder.

    `service` names the process's own section (gateway, inference), whose secret files
    (`*_file` settings) are read into it: each container mounts only its own secrets, so the
    others' files are left unread. Preprocess and postprocess import the plugins of their
    own stages and validate their options; no other service imports plugin code. An
    inference process serves the deployment one of whose replicas listens on `listen`.
    """
    try:
        raw = yamltext.safe_load(Path(path).read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"config {path} must be a mapping at the top level")
    try:
        settings = Settings(**raw)
    except ValidationError as exc:
        raise ConfigError(_describe(path, exc)) from None
    base = Path(path).parent
    if not settings.repository.is_absolute():
        settings.repository = (base / settings.repository).resolve()
    settings.tls = settings.tls.resolved(base)
    if service in SECRET_SECTIONS:
        try:
            section = getattr(settings, service).with_files(base)
        except ValueError as exc:
            raise ConfigError(f"config {path} is invalid:\n  {exc}") from None
        setattr(settings, service, section)
    if service in STAGE_SECTIONS:
        _load_plugins(path, settings, service)
    settings._source = Path(path)
    if service == "inference" and listen is not None:
        return settings.as_deployment(settings.deployment_at(listen))
    return settings


def _load_plugins(path: Path, settings: Settings, section: str) -> None:
    """Every plugin stage of `section` imported and its options validated now, so that a
    mistake stops the load naming pipeline, position, kind and key, as for the built-ins."""
    lines = [f"config {path} is invalid:"]
    for name, pipeline in settings.pipelines.items():
        for index, stage in enumerate(getattr(pipeline, section)):
            if not isinstance(stage, PluginStage):
                continue
            try:
                stage.plugin(settings.repository)
            except PluginError as exc:
                where = f"pipelines.{name}.{section}.{index}"
                lines += [f"  {where}.{dotted(loc)}: {msg}" for loc, msg in exc.problems]
    if len(lines) > 1:
        raise ConfigError("\n".join(lines))


def _describe(path: Path, exc: ValidationError) -> str:
    lines = [f"config {path} is invalid:"]
    for error in exc.errors():
        lines.append(f"  {dotted(error['loc']) or '(top level)'}: {error['msg']}")
    return "\n".join(lines)
