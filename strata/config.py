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
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from strata.limits import TensorLimits
from strata.policies import AdminToken, GatewaySettings
from strata.security import TlsSettings
from strata.strict import Strict

Datatype = Literal[
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64", "BYTES",
]  # fmt: skip


class ConfigError(ValueError):
    """The config file is missing, unreadable or invalid; the message says where."""


class ServiceEndpoint(Strict):
    """Where one service listens, and where its callers reach it."""

    listen: str = Field(description="host:port the service binds, e.g. 127.0.0.1:8101.")
    target: str | None = Field(
        default=None,
        description="gRPC target callers use (e.g. dns:///preprocess:8101); defaults to the "
        "listen address, or to all local replicas' addresses.",
    )
    replicas: int = Field(
        default=1,
        ge=1,
        description="Local processes `make run` starts, on consecutive ports from listen's.",
    )
    metrics: str | None = Field(
        default=None,
        description="host:port of the Prometheus /metrics page (replicas: consecutive ports).",
    )

    @field_validator("listen", "metrics")
    @classmethod
    def _has_port(cls, value: str | None) -> str | None:
        return _host_port(value)

    @property
    def listens(self) -> list[str]:
        """The listen address of each local replica."""
        return _consecutive(self.listen, self.replicas)

    def metrics_for(self, listen: str) -> str | None:
        """The metrics address of the replica listening on `listen`."""
        if self.metrics is None:
            return None
        index = self.listens.index(listen) if listen in self.listens else 0
        return _consecutive(self.metrics, index + 1)[-1]

    @property
    def address(self) -> str:
        """What callers dial: gRPC balances over every address of an `ipv4:` target."""
        if self.target:
            return self.target
        if self.replicas == 1:
            return self.listen
        return "ipv4:" + ",".join(self.listens)


def _host_port(value: str | None) -> str | None:
    if value is None:
        return value
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"listen address {value!r} must be host:port")
    return value


class GatewayEndpoint(ServiceEndpoint):
    """The gateway's endpoint: its gRPC port, and the same API over HTTP where set."""

    rest: str | None = Field(
        default=None,
        description="host:port of the KServe v2 REST API (HTTP/JSON, the binary tensor "
        "extension), served by the gateway process beside gRPC; unset: gRPC only.",
    )

    @field_validator("rest")
    @classmethod
    def _rest_has_port(cls, value: str | None) -> str | None:
        return _host_port(value)


def _consecutive(address: str, count: int) -> list[str]:
    host, _, port = address.rpartition(":")
    return [f"{host}:{int(port) + i}" for i in range(count)]


class Services(Strict):
    """The layers' endpoints."""

    gateway: GatewayEndpoint = Field(description="The public KServe v2 endpoint.")
    preprocess: ServiceEndpoint = Field(description="The preprocess service (or its replicas).")
    inference: dict[str, ServiceEndpoint] = Field(
        min_length=1,
        description="Inference deployments by name; pipeline routes (A/B arms) name them.",
    )
    postprocess: ServiceEndpoint = Field(description="The postprocess rule engine.")

    @property
    def primary_inference(self) -> ServiceEndpoint:
        """The first inference deployment: where a lone inference process listens."""
        return next(iter(self.inference.values()))

    def endpoint_of(self, listen: str) -> ServiceEndpoint | None:
        """The endpoint one of whose replicas listens on `listen`."""
        endpoints = [self.gateway, self.preprocess, self.postprocess, *self.inference.values()]
        return next((e for e in endpoints if listen in e.listens), None)


class ServerSettings(Strict):
    """Behaviour every gRPC server shares."""

    grace_seconds: float = Field(default=5.0, gt=0, description="Drain time after SIGTERM.")
    max_message_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="Largest gRPC message sent or received."
    )
    max_concurrent_streams: int = Field(
        default=256, gt=0, description="Calls one client connection may have open at once."
    )
    public_max_concurrent_streams: int = Field(
        default=16,
        gt=0,
        description="The same on the gateway's public port. Past capacity, calls beyond it are "
        "refused by HTTP/2 itself (REFUSED_STREAM, which clients see as UNAVAILABLE) before any "
        "Python runs, so a backlog cannot build inside gRPC where no handler sees it; a client "
        "that needs more calls in flight opens more connections (channels).",
    )
    max_concurrent_rpcs: int = Field(
        default=2048,
        gt=0,
        description="Calls one server runs at once, health checks included; gRPC refuses any "
        "beyond it at once (RESOURCE_EXHAUSTED, before a handler runs): the backstop behind "
        "the gateway's adaptive concurrency limit, so a backlog cannot grow without bound.",
    )
    max_connection_age_seconds: float = Field(
        default=60.0,
        gt=0,
        description="Internal services ask callers to reconnect after this long, so they "
        "re-resolve DNS and spread over replicas added since (in-flight calls finish first).",
    )


class TelemetrySettings(Strict):
    """Tracing; exporting happens only when an OTLP endpoint is set."""

    otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/gRPC collector; OTEL_EXPORTER_OTLP_ENDPOINT also works.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        default="INFO", description="Log level for every service (JSON lines on stderr)."
    )
    sample_ratio: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Share of new traces sampled (parent-based: a sampled caller's trace "
        "is always kept); OTEL_TRACES_SAMPLER overrides.",
    )


class TensorSpec(Strict):
    """A tensor a pipeline takes or returns."""

    name: str = Field(description="Tensor name on the wire.")
    datatype: Datatype = Field(description="KServe v2 datatype.")
    shape: list[int] = Field(description="Dimensions; -1 marks a variable one (batch first).")
    max_shape: list[int] | None = Field(
        default=None, description="Upper bound of each dimension, for variable ones."
    )
    allow_nonfinite: bool = Field(default=False, description="Accept NaN and infinities.")
    range: tuple[float, float] | None = Field(
        default=None,
        description="Inputs of a numeric datatype: the lowest and highest value accepted "
        "(inclusive), checked at the gateway before any upstream call; NaN is outside it.",
    )
    utf8: bool = Field(default=False, description="BYTES elements must be valid UTF-8 text.")
    max_element_bytes: int = Field(
        default=1 << 20, gt=0, description="Largest BYTES element (a string or an image)."
    )
    optional: bool = Field(
        default=False,
        description="Outputs only: an answer may lack it when the rule making it was skipped "
        "(its time limit, level 1 for a rule that is not core, a `when:` that did not hold); "
        "the answer names the skipped rules in strata.skipped_rules. A required output that "
        "cannot be made fails the request with UNAVAILABLE naming it.",
    )

    @model_validator(mode="after")
    def _shapes_agree(self) -> TensorSpec:
        if any(d < -1 or d == 0 for d in self.shape):
            raise ValueError(f"{self.name}: dimensions must be positive or -1, got {self.shape}")
        if self.max_shape is not None and len(self.max_shape) != len(self.shape):
            raise ValueError(f"{self.name}: max_shape must have {len(self.shape)} dimensions")
        if self.range is not None and not self.range[0] <= self.range[1]:
            raise ValueError(f"{self.name}: range {list(self.range)} must be [low, high]")
        if self.range is not None and self.datatype in ("BYTES", "BOOL"):
            raise ValueError(f"{self.name}: range applies to numeric datatypes only")
        return self

    def limit(self, axis: int) -> float:
        """The largest size dimension `axis` may take."""
        if self.shape[axis] != -1:
            return self.shape[axis]
        return self.max_shape[axis] if self.max_shape else math.inf


class StageSpec(BaseModel):
    """One preprocess step or postprocess rule: its kind, a few shared keys, its own options.

    `core`, `when` and `timeout_seconds` apply to postprocess rules only; the preprocess
    service refuses them on a step.
    """

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="Registered step or rule name, e.g. resize or softmax.")
    name: str | None = Field(
        default=None,
        min_length=1,
        description="Name in timings, logs and skipped_rules; defaults to kind; unique per list.",
    )
    core: bool = Field(
        default=True,
        description="Rules only: a core rule still runs when a request asks for core_only.",
    )
    when: dict[str, str | bool] | None = Field(
        default=None,
        description="Rules only: run only if {parameter: P} is sent (equals: V, that value) "
        "or {tensor: T} exists at that point; negate: true inverts it.",
    )
    timeout_seconds: float | None = Field(
        default=None,
        gt=0,
        description="Rules only: this rule's limit; postprocess.rule_timeout_seconds when unset.",
    )

    @field_validator("when")
    @classmethod
    def _condition(cls, when: dict[str, str | bool] | None) -> dict[str, str | bool] | None:
        if when is None:
            return None
        unknown = sorted(set(when) - {"parameter", "equals", "tensor", "negate"})
        if unknown:
            raise ValueError(
                f"when: unknown key {unknown[0]!r} (parameter, equals, tensor, negate)"
            )
        if ("parameter" in when) == ("tensor" in when):
            raise ValueError("when: give exactly one of 'parameter' or 'tensor'")
        if "equals" in when and "parameter" not in when:
            raise ValueError("when: 'equals' goes with 'parameter'")
        for key in ("parameter", "tensor", "equals"):
            if key in when and not isinstance(when[key], str):
                raise ValueError(f"when: {key!r} must be a string")
        if not isinstance(when.get("negate", False), bool):
            raise ValueError("when: 'negate' must be true or false")
        return when

    @property
    def label(self) -> str:
        """The stage's name in timings, logs and responses."""
        return self.name or self.kind

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class Route(Strict):
    """One arm of a pipeline's A/B split: an inference deployment and model version."""

    arm: str = Field(description="Arm name, reported in metrics and response parameters.")
    deployment: str = Field(description="Inference deployment (a key of services.inference).")
    version: str = Field(default="", description="Model version; empty means the model's.")
    weight: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, description="Share of traffic, relative to others."
    )


class Shadow(Strict):
    """A mirror route: it gets copies of requests; its answers are compared, never returned."""

    deployment: str = Field(description="Inference deployment the copies go to.")
    version: str = Field(default="", description="Model version; empty means the model's.")
    fraction: float = Field(default=1.0, gt=0, le=1, description="Share of requests mirrored.")


class ModelRef(Strict):
    """The model a pipeline runs, and how its traffic splits across deployments."""

    name: str = Field(description="Model name in the repository.")
    version: str = Field(default="", description="Version to call; empty means the latest.")
    routes: list[Route] = Field(
        default_factory=list,
        description="A/B arms; none means one arm on the first inference deployment.",
    )
    shadow: Shadow | None = Field(default=None, description="Optional mirror route.")

    @field_validator("routes")
    @classmethod
    def _arms_unique_and_weighted(cls, routes: list[Route]) -> list[Route]:
        arms = [r.arm for r in routes]
        if len(set(arms)) != len(arms):
            raise ValueError(f"arm names repeat: {arms}")
        if routes and sum(r.weight for r in routes) <= 0:
            raise ValueError("at least one route needs a positive weight")
        return routes


class Pipeline(Strict):
    """A pipeline: what clients see as one model."""

    inputs: list[TensorSpec] = Field(min_length=1, description="Inputs clients send.")
    outputs: list[TensorSpec] = Field(min_length=1, description="Outputs clients receive.")
    max_batch_size: int = Field(default=64, gt=0, description="Largest batch a request may carry.")
    preprocess: list[StageSpec] = Field(default_factory=list, description="Steps after validation.")
    model: ModelRef = Field(description="The model the inputs feed, and its routes.")
    latency_objective_ms: float = Field(
        default=250.0, gt=0, description="P95 latency the ladder defends for this pipeline."
    )
    cache: bool = Field(default=False, description="Answer repeated requests from the cache.")
    forward_to_postprocess: list[str] = Field(
        default_factory=list,
        description="Preprocess outputs (e.g. attention_mask) postprocess receives beside the "
        "model's outputs.",
    )
    default_answer: dict[str, list] | None = Field(
        default=None,
        description="One row of output values returned, marked degraded, when the ladder "
        "is at level 3 and the cache has no answer.",
    )
    postprocess: list[StageSpec] = Field(default_factory=list, description="Rules, in order.")

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names repeat: {names}")
        return specs


class InferenceSettings(Strict):
    """What the inference service loads at start-up, and the defaults model.yaml files override.

    `session` and `batching` are defaults for every model; a model's `model.yaml` may override
    any of their fields in sections of the same names.
    """

    class Session(Strict):
        """ONNX Runtime session options."""

        intra_op_threads: int = Field(
            default=1, ge=0, description="Threads inside one operator (0: ONNX Runtime decides)."
        )
        inter_op_threads: int = Field(
            default=1, ge=0, description="Threads across operators (0: ONNX Runtime decides)."
        )
        graph_optimization: Literal["disable", "basic", "extended", "all"] = Field(
            default="all", description="ONNX Runtime graph optimisation level."
        )
        execution_providers: list[str] = Field(
            default=["CUDAExecutionProvider", "CPUExecutionProvider"],
            min_length=1,
            description="Execution providers in order of preference; those not installed are "
            "skipped and CPUExecutionProvider is always the last resort.",
        )
        allow_spinning: bool = Field(
            default=False,
            description="Let idle ONNX Runtime threads spin; off since processes share cores.",
        )

        @field_validator("execution_providers")
        @classmethod
        def _provider_names(cls, names: list[str]) -> list[str]:
            for name in names:
                if not name.endswith("ExecutionProvider"):
                    raise ValueError(f"{name!r} is not an execution provider name")
            if len(set(names)) != len(names):
                raise ValueError(f"execution providers repeat: {names}")
            return names

    class Batching(Strict):
        """How requests to one model version are queued and formed into batches."""

        policy: Literal["adaptive", "fixed", "none"] = Field(
            default="adaptive",
            description="adaptive: run at once when idle, else wait a bound set by measured "
            "execution time; fixed: wait up to max_queue_delay_ms for a fuller batch; "
            "none: every request runs alone.",
        )
        max_queue_delay_ms: float = Field(
            default=4.0,
            ge=0,
            description="Longest a request waits for others to join (fixed: the window; "
            "adaptive: the upper bound of the adapted wait).",
        )
        wait_fraction: float = Field(
            default=1.0,
            gt=0,
            le=4,
            description="adaptive: the wait is at most this fraction of a batch's measured "
            "execution time.",
        )
        max_queue_rows: int = Field(
            default=1024,
            gt=0,
            description="Rows one version's queue holds; beyond it RESOURCE_EXHAUSTED at once.",
        )
        max_padding: float = Field(
            default=0.5,
            gt=0,
            le=1,
            description="Models with padded inputs: the largest share of a batch's cells that "
            "padding may fill. A request that would push a batch past it waits for one of "
            "lengths nearer its own (a batch pays for its longest request); 1 pads anything.",
        )
        inline_max_ms: float = Field(
            default=0.2,
            ge=0,
            description="Run a batch on the event loop, not a worker thread, when its measured "
            "run time is at most this (a thread hand-off costs about 0.2 ms, more than a small "
            "model's whole batch); 0: always on a worker thread.",
        )
        max_concurrent_batches: int | None = Field(
            default=None,
            gt=0,
            description="Batches of one version running at once; default: inference.workers.",
        )
        priority_levels: int = Field(
            default=3, gt=0, description="Request priorities 1 (first) to this number."
        )
        default_priority: int = Field(
            default=2, gt=0, description="Priority of a request that sets none (or 0)."
        )

        @model_validator(mode="after")
        def _default_is_a_level(self) -> InferenceSettings.Batching:
            if self.default_priority > self.priority_levels:
                raise ValueError(
                    f"default_priority {self.default_priority} is above "
                    f"priority_levels {self.priority_levels}"
                )
            return self

    models: list[str] = Field(min_length=1, description="Repository models to load and warm.")
    workers: int = Field(default=2, gt=0, description="Model runs allowed at once (threads).")
    session: Session = Field(default_factory=Session, description="Session option defaults.")
    batching: Batching = Field(default_factory=Batching, description="Batching defaults.")
    poll_seconds: float = Field(
        default=0.0,
        ge=0,
        description="Rescan the repository for new or changed versions this often (0: never; "
        "RepositoryModelLoad still reloads on demand).",
    )
    admin_token: AdminToken = Field(
        default=None,
        description="Token RepositoryModelLoad and RepositoryModelUnload require, as "
        "'authorization: Bearer <token>' (STRATA_INFERENCE__ADMIN_TOKEN); unset or empty "
        "turns model load and unload off.",
    )

    @field_validator("models")
    @classmethod
    def _models_unique(cls, names: list[str]) -> list[str]:
        if len(set(names)) != len(names):
            raise ValueError(f"model names repeat: {names}")
        return names


class PreprocessSettings(Strict):
    """Where the preprocess steps run."""

    inline_max_bytes: int = Field(
        default=16384,
        ge=0,
        description="A call whose tensors hold at most this many bytes runs its steps on the "
        "event loop (a thread hand-off costs more than the steps of a small input); larger "
        "calls, e.g. big images or long texts, run on a worker thread so the loop stays free.",
    )


class PostprocessSettings(Strict):
    """The rule engine: time limits and the threads rule chains run on."""

    rule_timeout_seconds: float = Field(
        default=0.5, gt=0, description="Time limit of a rule that sets no timeout_seconds."
    )
    workers: int = Field(default=4, gt=0, description="Rule chains running at once (threads).")
    spare_threads: int = Field(
        default=4,
        ge=0,
        description="Extra threads that abandoned (overrunning) rules may hold until they end.",
    )


class Settings(BaseSettings):
    """The whole deployment."""

    model_config = SettingsConfigDict(
        env_prefix="STRATA_", env_nested_delimiter="__", extra="forbid"
    )
    # The file these settings came from, so a running service can reload it.
    _source: Path | None = PrivateAttr(default=None)

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
    inference: InferenceSettings = Field(description="Models the inference service serves.")
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
        for name, pipeline in self.pipelines.items():
            if pipeline.model.name not in self.inference.models:
                raise ValueError(
                    f"pipeline {name!r} uses model {pipeline.model.name!r}, "
                    f"which inference.models does not load"
                )
            routes = [*pipeline.model.routes, *filter(None, [pipeline.model.shadow])]
            for route in routes:
                if route.deployment not in self.services.inference:
                    raise ValueError(
                        f"pipeline {name!r} routes to deployment {route.deployment!r}, "
                        f"not one of services.inference: {sorted(self.services.inference)}"
                    )
        return self

    @property
    def source(self) -> Path | None:
        """The config file these settings were loaded from."""
        return self._source

    def routes(self, pipeline: str) -> list[Route]:
        """A pipeline's arms; with none configured, one arm on the first deployment."""
        model = self.pipelines[pipeline].model
        if model.routes:
            return model.routes
        first = next(iter(self.services.inference))
        return [Route(arm=first, deployment=first, version=model.version)]


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
    settings.tls = settings.tls.resolved(Path(path).parent)
    settings._source = Path(path)
    return settings


def _describe(path: Path, exc: ValidationError) -> str:
    lines = [f"config {path} is invalid:"]
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        lines.append(f"  {where}: {error['msg']}")
    return "\n".join(lines)
