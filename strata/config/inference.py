"""The inference service: the models it loads, their sessions and their batching."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from strata.config.base import AdminToken, Strict, admin_token_from, not_both


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
            description="Models with padded inputs not run in buckets of like length "
            "(docs/inference.md): the largest share of a batch's cells that padding may fill. "
            "A request that would push a batch past it waits for one of lengths nearer its "
            "own (a batch pays for its longest request); 1 pads anything.",
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

    models: list[str] | dict[str, list[str]] | None = Field(
        default=None,
        description="Repository models each deployment loads and warms: unset, the models its "
        "routes (and shadows) name; a list, every deployment loads it; a mapping of deployment "
        "to list, each named deployment loads its own (the others what their routes name).",
    )
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
        description="Token the model repository API (RepositoryIndex, RepositoryModelLoad, "
        "RepositoryModelUnload) requires, as 'authorization: Bearer <token>' "
        "(STRATA_INFERENCE__ADMIN_TOKEN), at least 32 characters; unset or empty turns it off. "
        "The gateway calls that API with it for its own repository control.",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="A file holding that token instead (a mounted secret; relative to the "
        "config file), read at start, and by the gateway at each repository control call.",
    )

    @model_validator(mode="after")
    def _one_admin_token(self) -> InferenceSettings:
        not_both(self, "admin_token", "admin_token_file")
        return self

    def with_files(self, base: Path) -> InferenceSettings:
        """A copy with admin_token_file read into admin_token (relative against `base`)."""
        if self.admin_token_file is None:
            return self
        setting = "inference.admin_token_file"
        token = admin_token_from(self.admin_token_file, base, setting)
        return self.model_copy(update={"admin_token": token})

    @field_validator("models")
    @classmethod
    def _models_unique(
        cls, models: list[str] | dict[str, list[str]] | None
    ) -> list[str] | dict[str, list[str]] | None:
        lists = models.values() if isinstance(models, dict) else [models or []]
        for names in lists:
            if len(set(names)) != len(names):
                raise ValueError(f"model names repeat: {names}")
        return models

    def loads(self, deployment: str, routed: list[str]) -> list[str]:
        """The models `deployment` loads, given those its routes name (`routed`)."""
        if isinstance(self.models, dict):
            return self.models.get(deployment, routed)
        return routed if self.models is None else self.models

    def for_deployment(self, deployment: str, routed: list[str]) -> InferenceSettings:
        """A copy whose `models` is the list `deployment` loads."""
        return self.model_copy(update={"models": self.loads(deployment, routed)})
