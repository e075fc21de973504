"""Pipelines: what clients see as one model, from the tensors they send to the answer."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, field_validator, model_validator

from strata.config.base import LIVE, Datatype, Strict
from strata.config.postprocess import Rule
from strata.config.preprocess import Step
from strata.sequences import PipelineSequence


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
    format: Literal["NHWC", "NCHW"] | None = Field(
        default=None,
        description="Inputs that are images (rank 4, batch first): the order of the other "
        "three dimensions, height, width and channels (NHWC) or channels first (NCHW). The "
        "model config says it (FORMAT_NHWC, FORMAT_NCHW), and image clients such as Triton's "
        "shape what they send by it.",
    )
    labels: list[str] | None = Field(
        default=None,
        description="Outputs only: the name of each class by its index, which the "
        "classification extension adds to its answers (score:index:label).",
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
        if self.format is not None and len(self.shape) != 4:
            raise ValueError(
                f"{self.name}: format {self.format} needs rank 4 (batch first), "
                f"got shape {self.shape}"
            )
        return self

    def limit(self, axis: int) -> float:
        """The largest size dimension `axis` may take."""
        if self.shape[axis] != -1:
            return self.shape[axis]
        return self.max_shape[axis] if self.max_shape else math.inf


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

    def versions_called(self) -> list[str]:
        """The versions its routes and shadow call ("": whichever the deployment serves)."""
        called = [route.version or self.version for route in self.routes] or [self.version]
        if self.shadow is not None:
            called.append(self.shadow.version or self.version)
        return called

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
    max_batch_size: int = Field(
        default=64,
        ge=0,
        description="Largest batch a request may carry; 0: the inputs and outputs have no "
        "batch dimension (a model that takes one fixed-shape input): each request is one, "
        "travels alone, and is described as Triton does (max_batch_size 0, every dimension).",
    )
    preprocess: list[Step] = Field(
        default_factory=list, description="Steps after validation, in order, chosen by kind."
    )
    model: ModelRef = Field(description="The model the inputs feed, and its routes.")
    latency_objective_ms: float = Field(
        default=250.0,
        gt=0,
        description="P95 latency the ladder defends for this pipeline.",
        json_schema_extra=LIVE,
    )
    cache: bool = Field(
        default=False,
        description="Answer repeated requests from the cache.",
        json_schema_extra=LIVE,
    )
    shared_cache: bool = Field(
        default=False,
        description="Cached answers serve every client. By default each client (its API "
        "key's client, else its client id or address) has its own, so that strata.cached "
        "never tells a client what another one sent.",
    )
    forward_to_postprocess: list[str] = Field(
        default_factory=list,
        description="Preprocess outputs (e.g. attention_mask) postprocess receives beside the "
        "model's outputs.",
    )
    default_answer: dict[str, list] | None = Field(
        default=None,
        description="One row of output values returned, marked degraded, when the ladder "
        "is at level 3 and the cache has no answer.",
        json_schema_extra=LIVE,
    )
    postprocess: list[Rule] = Field(
        default_factory=list, description="Rules, in order, chosen by kind."
    )
    sequence: PipelineSequence | None = Field(
        default=None,
        description="The model is stateful (its model.yaml has `sequence:`): requests carry "
        "Triton's sequence_id, sequence_start and sequence_end, and each sequence stays on one "
        "arm and one replica, in order (docs/gateway.md, Sequences).",
    )

    @model_validator(mode="after")
    def _default_answer_has_rows(self) -> Pipeline:
        if self.max_batch_size == 0 and self.default_answer is not None:
            raise ValueError("default_answer is one row of a batch: it needs max_batch_size > 0")
        return self

    @model_validator(mode="after")
    def _sequence_is_answered_live(self) -> Pipeline:
        """A sequence's answer depends on its state: never from a cache, a default or a
        mirror (which would see requests without their state)."""
        if self.sequence is not None:
            for key in ("cache", "shared_cache", "default_answer"):
                if getattr(self, key):
                    raise ValueError(f"a pipeline with a sequence cannot have {key}")
            if self.model.shadow is not None:
                raise ValueError("a pipeline with a sequence cannot have a shadow route")
        return self

    @field_validator("inputs", "outputs")
    @classmethod
    def _unique(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        names = [s.name for s in specs]
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names repeat: {names}")
        return specs

    @field_validator("outputs")
    @classmethod
    def _outputs_have_no_format(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        for spec in specs:
            if spec.format is not None:
                raise ValueError(f"output {spec.name}: format applies to inputs only")
        return specs

    @field_validator("inputs")
    @classmethod
    def _inputs_have_no_labels(cls, specs: list[TensorSpec]) -> list[TensorSpec]:
        for spec in specs:
            if spec.labels is not None:
                raise ValueError(f"input {spec.name}: labels apply to outputs only")
        return specs

    @property
    def batched(self) -> bool:
        """Whether every tensor's first dimension is a free batch dimension: Triton then
        describes it by max_batch_size, else the pipeline takes one fixed shape."""
        return all(spec.shape[0] == -1 for spec in [*self.inputs, *self.outputs])
