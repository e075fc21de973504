"""The deployment's one YAML file, typed and validated at load time.

Every service reads the same file and uses its own section. Environment variables prefixed
`STRATA_` override the file (nested keys joined by `__`, e.g.
`STRATA_SERVICES__GATEWAY__LISTEN=0.0.0.0:8001`), so containers need no edited copy.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


class ConfigError(ValueError):
    """The config file is missing, unreadable or invalid; the message says where."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ServiceEndpoint(Strict):
    """Where one service listens, and where its callers reach it."""

    listen: str = Field(description="host:port the service binds, e.g. 127.0.0.1:8101.")
    target: str | None = Field(
        default=None,
        description="gRPC target callers use (e.g. dns:///preprocess:8101); defaults to listen.",
    )

    @field_validator("listen")
    @classmethod
    def _has_port(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"listen address {value!r} must be host:port")
        return value

    @property
    def address(self) -> str:
        return self.target or self.listen


class Services(Strict):
    """The four layers' endpoints."""

    gateway: ServiceEndpoint = Field(description="The public KServe v2 endpoint.")
    preprocess: ServiceEndpoint = Field(description="The preprocess service (or its replicas).")
    inference: ServiceEndpoint = Field(description="The inference service.")
    postprocess: ServiceEndpoint = Field(description="The postprocess rule engine.")


class ServerSettings(Strict):
    """Behaviour every gRPC server shares."""

    grace_seconds: float = Field(default=5.0, gt=0, description="Drain time after SIGTERM.")
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest gRPC message sent or received."
    )


class TelemetrySettings(Strict):
    """Tracing; exporting happens only when an OTLP endpoint is set."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/gRPC collector; OTEL_EXPORTER_OTLP_ENDPOINT also works.",
    )
    log_level: str = Field(default="INFO", description="Python log level for every service.")


class TensorSpec(Strict):
    """A tensor a pipeline takes or returns."""

    name: str = Field(description="Tensor name on the wire.")
    datatype: Datatype = Field(description="KServe v2 datatype.")
    shape: list[int] = Field(description="Dimensions; -1 marks a variable one (batch first).")
    max_shape: list[int] | None = Field(
        default=None, description="Upper bound of each dimension, for variable ones."
    )
    allow_nonfinite: bool = Field(default=False, description="Accept NaN and infinities.")
    utf8: bool = Field(default=False, description="BYTES elements must be valid UTF-8 text.")

    @model_validator(mode="after")
    def _shapes_agree(self) -> TensorSpec:
        if any(d < -1 or d == 0 for d in self.shape):
            raise ValueError(f"{self.name}: dimensions must be positive or -1, got {self.shape}")
        if self.max_shape is not None and len(self.max_shape) != len(self.shape):
            raise ValueError(f"{self.name}: max_shape must have {len(self.shape)} dimensions")
        return self

    def limit(self, axis: int) -> float:
        """The largest size dimension `axis` may take."""
        if self.shape[axis] != -1:
            return self.shape[axis]
        return self.max_shape[axis] if self.max_shape else math.inf


class StageSpec(BaseModel):
    """One preprocess step or postprocess rule: its kind, then its own options."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="Registered step or rule name, e.g. resize or softmax.")

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelRef(Strict):
    """The model a pipeline runs on the inference service."""

    name: str = Field(description="Model name in the repository.")
    version: str = Field(default="", description="Version to call; empty means the latest.")


class Pipeline(Strict):
    """A pipeline: what clients see as one model."""

    inputs: list[TensorSpec] = Field(min_length=1, description="Inputs clients send.")
    outputs: list[TensorSpec] = Field(min_length=1, description="Outputs clients receive.")
    max_batch_size: int = Field(default=64, gt=0, description="Largest batch a request may carry.")
    preprocess: list[StageSpec] = Field(default_factory=list, description="Steps after validation.")
    model: ModelRef = Field(description="The model the inputs feed.")
    postprocess: list[StageSpec] = Field(default_factory=list, description="Rules, in order.")

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names repeat: {names}")
        return specs


class InferenceSettings(Strict):
    """What the inference service loads at start-up."""

    models: list[str] = Field(min_length=1, description="Repository models to load and warm.")
    intra_op_threads: int = Field(default=1, ge=0, description="ONNX Runtime intra-op threads.")
    inter_op_threads: int = Field(default=1, ge=0, description="ONNX Runtime inter-op threads.")
    workers: int = Field(default=2, gt=0, description="Model runs allowed at once (threads).")


class GatewaySettings(Strict):
    """Gateway policies."""

    default_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Budget of a request whose caller set no deadline."
    )


class Settings(BaseSettings):
    """The whole deployment."""

    model_config = SettingsConfigDict(
        env_prefix="STRATA_", env_nested_delimiter="__", extra="forbid"
    )

    services: Services = Field(description="Where each layer listens.")
    server: ServerSettings = Field(
        default_factory=ServerSettings, description="Shared server behaviour."
    )
    telemetry: TelemetrySettings = Field(
        default_factory=TelemetrySettings, description="Tracing and logs."
    )
    repository: Path = Field(description="Model repository folder (relative to the config file).")
    gateway: GatewaySettings = Field(default_factory=GatewaySettings, description="Policies.")
    inference: InferenceSettings = Field(description="Models the inference service serves.")
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
        for name, pipeline in self.pipelines.items():
            if pipeline.model.name not in self.inference.models:
                raise ValueError(
                    f"pipeline {name!r} uses model {pipeline.model.name!r}, "
                    f"which inference.models does not load"
                )
        return self


def load_settings(path: Path) -> Settings:
    """Read and validate the config file; relative paths resolve against its folder."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
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
    if not settings.repository.is_absolute():
        settings.repository = (Path(path).parent / settings.repository).resolve()
    return settings


def _describe(path: Path, exc: ValidationError) -> str:
    lines = [f"config {path} is invalid:"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(f"  {where}: {error['msg']}")
    return "\n".join(lines)
