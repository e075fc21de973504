"""Pipelines: what clients see as one model, from the tensors they send to the answer."""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from strata.config.base import LIVE, Datatype, Strict
from strata.config.postprocess import Rule
from strata.config.preprocess import DecodeStep, Step
from strata.wire.triton_sequences import PipelineSequence

DEFAULT_ELEMENT_BYTES = 1 << 20


class TensorSpec(Strict):
    """What every tensor a pipeline takes or returns declares."""

    name: str = Field(description="Tensor name on the wire.")
    datatype: Datatype = Field(description="KServe v2 datatype.")
    shape: list[int] = Field(description="Dimensions, batch first; -1 marks a variable one.")

    @model_validator(mode="after")
    def _dimensions_are_sizes(self) -> TensorSpec:
        if any(d < -1 or d == 0 for d in self.shape):
            raise ValueError(f"{self.name}: dimensions must be positive or -1, got {self.shape}")
        return self


class InputSpec(TensorSpec):
    """A tensor clients send, checked at the gateway before any upstream call."""

    shape: list[int] = Field(
        description="Dimensions a request's tensor must have, batch first (none where "
        "max_batch_size is 0); -1: any size, up to max_shape."
    )
    max_shape: list[int] | None = Field(
        default=None,
        description="Largest size of each variable (-1) dimension, one entry per dimension "
        "(those of fixed ones are not read); unset: no bound but the message size.",
    )
    allow_nonfinite: bool = Field(
        default=False, description="Accept NaN and infinities in a floating-point input."
    )
    range: tuple[float, float] | None = Field(
        default=None,
        description="Numeric datatypes: the lowest and highest value accepted (inclusive), "
        "checked at the gateway; NaN is outside it.",
    )
    utf8: bool = Field(default=False, description="BYTES elements must be valid UTF-8 text.")
    max_element_bytes: int = Field(
        default=DEFAULT_ELEMENT_BYTES,
        gt=0,
        description="Largest BYTES element (a string or an encoded image), checked at the "
        "gateway. Unset: 1 MiB, or "
        "for an input a `decode` step reads first, that step's max_bytes (16 MiB unless set), "
        "so that a photo decode takes passes the gateway too.",
    )
    format: Literal["NHWC", "NCHW"] | None = Field(
        default=None,
        description="An image input (rank 4, batch first; or rank 3 in a pipeline with "
        "max_batch_size 0, which has no batch dimension, as Triton's densenet_onnx): the "
        "order of its three image dimensions, height, width and channels (NHWC) or channels "
        "first (NCHW). The model config says it (FORMAT_NHWC, FORMAT_NCHW), and image clients "
        "such as Triton's shape what they send by it.",
    )
    allow_empty: bool = Field(
        default=False,
        description="A variable (-1) dimension may be 0, an empty tensor (as a decoupled "
        "pipeline's request for no responses is).",
    )

    @model_validator(mode="after")
    def _options_agree(self) -> InputSpec:
        if self.max_shape is not None and len(self.max_shape) != len(self.shape):
            raise ValueError(f"{self.name}: max_shape must have {len(self.shape)} dimensions")
        if self.range is not None and not self.range[0] <= self.range[1]:
            raise ValueError(f"{self.name}: range {list(self.range)} must be [low, high]")
        if self.range is not None and self.datatype in ("BYTES", "BOOL"):
            raise ValueError(f"{self.name}: range applies to numeric datatypes only")
        if self.allow_empty and -1 not in self.shape:
            raise ValueError(f"{self.name}: allow_empty needs a variable (-1) dimension")
        if self.format is not None and len(self.shape) not in (3, 4):
            raise ValueError(
                f"{self.name}: format {self.format} needs rank 4 (batch first), or rank 3 "
                f"in a pipeline with max_batch_size 0, got shape {self.shape}"
            )
        return self

    def limit(self, axis: int) -> float:
        """The largest size dimension `axis` may take."""
        if self.shape[axis] != -1:
            return self.shape[axis]
        return self.max_shape[axis] if self.max_shape else math.inf


class OutputSpec(TensorSpec):
    """A tensor clients receive, made by the model and the postprocess rules."""

    shape: list[int] = Field(
        description="Dimensions of the answer's tensor, batch first (none where "
        "max_batch_size is 0); -1: any size. What the rules make must fit them, else the "
        "request fails FAILED_PRECONDITION: the pipeline does not make what it declares."
    )
    labels: list[str] | None = Field(
        default=None,
        description="The name of each class by its index, which the classification "
        "extension adds to its answers (score:index:label).",
    )
    optional: bool = Field(
        default=False,
        description="An answer may lack it when the rule making it was skipped (its time "
        "limit, level 1 for a rule that is not core, a `when:` that did not hold); the "
        "answer names the skipped rules in strata.skipped_rules. A required output that "
        "cannot be made fails the request with UNAVAILABLE naming it.",
    )


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


class Condition(Strict):
    """Which rows a stage runs for: those where a measure of an earlier tensor, taken per
    row over its other dimensions, is below (or above) a bound."""

    tensor: str = Field(description="A tensor an earlier stage gave (e.g. logits).")
    measure: Literal["top_probability", "margin", "max", "min"] = Field(
        default="top_probability",
        description="top_probability: the largest softmax probability of the row; margin: "
        "the top two probabilities' difference; max, min: the row's largest or smallest value.",
    )
    below: float | None = Field(
        default=None, allow_inf_nan=False, description="Run for rows whose measure is below it."
    )
    above: float | None = Field(
        default=None, allow_inf_nan=False, description="Run for rows whose measure is above it."
    )

    @model_validator(mode="after")
    def _one_bound(self) -> Condition:
        if (self.below is None) == (self.above is None):
            raise ValueError(f"condition on {self.tensor!r}: give exactly one of below, above")
        return self


class Fallback(Strict):
    """A cheaper model run instead of a pipeline's first model or a stage's, its answers
    marked degraded."""

    model: ModelRef = Field(
        description="The model: it takes the inputs of the model it stands in for and gives "
        "its outputs (a stage's renamed as the stage renames them)."
    )
    from_level: int | None = Field(
        default=None,
        ge=1,
        le=3,
        description="The degradation level from which it always runs instead of the model "
        "it stands in for; none: only when that one cannot answer.",
    )

    @model_validator(mode="after")
    def _no_shadow(self) -> Fallback:
        if self.model.shadow is not None:
            raise ValueError("a fallback model takes no shadow")
        return self


class Stage(Strict):
    """A model after the pipeline's first one: it reads tensors preprocess or earlier stages
    made and gives its outputs to the stages after it and to postprocess."""

    name: str = Field(
        default="", description="Stage name in strata.stages and spans; empty: its model's."
    )
    model: ModelRef = Field(
        description="The model it runs, its routes and its optional shadow (fed the rows the "
        "stage runs for, as its arm got them)."
    )
    inputs: dict[str, str] = Field(
        min_length=1,
        description="Each model input and the tensor that feeds it: one the first model "
        "takes (preprocess's) or one an earlier model gave.",
    )
    outputs: dict[str, str] = Field(
        default_factory=dict,
        description="Model outputs renamed as they are given on; an output not named here "
        "keeps its name.",
    )
    fallback: Fallback | None = Field(
        default=None,
        description="A cheaper model run instead when the stage's own cannot answer (its "
        "arms unavailable, overloaded, failing, their circuits open, the model not served) "
        "or from a degradation level; its answers are marked degraded and never cached.",
    )
    parallel: bool = Field(
        default=False,
        description="Run at the same time as the stage before it (fan-out): it reads nothing "
        "that stage gives, and they give different tensors, which a postprocess rule may "
        "merge (e.g. mean).",
    )
    when: Condition | None = Field(
        default=None,
        description="Run only for the rows that meet it; the others keep the tensors earlier "
        "stages gave (a cascade's early exit), so a stage with a condition may only give "
        "tensors an earlier stage gave.",
    )

    @property
    def label(self) -> str:
        return self.name or self.model.name


class Decoupled(Strict):
    """A pipeline whose answer to a request is zero or more responses on ModelStreamInfer
    (Triton's decoupled transaction policy): each output's first dimension counts them."""

    max_responses: int = Field(
        default=1024,
        gt=0,
        description="The most responses one request's answer may have; an answer with more "
        "fails that request with INVALID_ARGUMENT naming the limit. With "
        "server.max_stream_in_flight (requests), it bounds the responses one stream can make "
        "the gateway hold.",
    )


class Pipeline(Strict):
    """A pipeline: what clients see as one model."""

    inputs: list[InputSpec] = Field(min_length=1, description="Inputs clients send.")
    outputs: list[OutputSpec] = Field(min_length=1, description="Outputs clients receive.")
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
    fallback: Fallback | None = Field(
        default=None,
        description="A cheaper model run instead of `model` when that one cannot answer (its "
        "arms unavailable, overloaded, failing, their circuits open, the model not served) "
        "or from a degradation level; it takes preprocess's outputs and gives the model's. "
        "Its answers are marked degraded and never cached (docs/pipelines.md).",
    )
    stages: list[Stage] = Field(
        default_factory=list,
        description="Models that run after `model`, in order, each on its tensors or earlier "
        "stages' (docs/pipelines.md); none: a pipeline of one model.",
    )
    latency_objective_ms: float = Field(
        default=250.0,
        gt=0,
        description="P95 latency the ladder defends for this pipeline.",
        json_schema_extra=LIVE,
    )
    max_in_air: int | None = Field(
        default=None,
        ge=1,
        description="Flights in the air beside which this pipeline's next flight may still "
        "leave; none: gateway.flights.max_in_air. Raise it for a pipeline whose work is "
        "mostly in a replicated layer (photos through preprocess replicas): with 2 replicas, "
        "3 lets each replica work on a flight while a third is in the rest of the chain "
        "(docs/gateway.md, Flights).",
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
    default_answer: dict[str, list[Any]] | None = Field(
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

    decoupled: Decoupled | None = Field(
        default=None,
        description="The pipeline answers each request with zero or more responses, on "
        "ModelStreamInfer only (docs/gateway.md, Decoupled): each output's first dimension "
        "counts the responses, and response i carries each output's row i, of the shape the "
        "output declares. `true` for the defaults. Needs max_batch_size 0 (a request travels "
        "whole) and no sequence.",
    )

    @field_validator("decoupled", mode="before")
    @classmethod
    def _decoupled_flag(cls, value: object) -> object:
        """`decoupled: true` (or false) as YAML writes it most often."""
        if isinstance(value, bool):
            return {} if value else None
        return value

    @model_validator(mode="after")
    def _decoupled_takes_requests_whole(self) -> Pipeline:
        if self.decoupled is None:
            return self
        if self.max_batch_size != 0:
            raise ValueError(
                "a decoupled pipeline's answer is its responses, first dimension first: it "
                "needs max_batch_size 0 (each request travels whole, not as rows of a batch)"
            )
        if self.sequence is not None:
            raise ValueError("a decoupled pipeline takes no sequence (not supported yet)")
        return self

    @model_validator(mode="after")
    def _stages_named_once(self) -> Pipeline:
        names = [self.model.name, *(stage.label for stage in self.stages)]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat (the first is its model's name): {names}")
        slashed = [name for name in names[1:] if "/" in name]
        if slashed:
            raise ValueError(
                f"stage {slashed[0]!r}: a stage's name has no '/' (strata.stages names a "
                "fallback's answer '<stage>/fallback')"
            )
        if self.stages and self.stages[0].parallel:
            raise ValueError(
                f"stage {self.stages[0].label!r}: parallel runs a stage beside the stage before "
                "it; the first stage has none (the first model runs before every stage)"
            )
        if self.stages and self.sequence is not None:
            raise ValueError("a stateful pipeline (sequence) runs one model: it takes no stages")
        if self.fallback is not None and self.sequence is not None:
            raise ValueError(
                "a stateful pipeline (sequence) keeps its state in one model: it takes no fallback"
            )
        if self.stages and self.max_batch_size == 0:
            raise ValueError("stages carry rows of a batch: they need max_batch_size > 0")
        return self

    def answer_outputs(self) -> list[OutputSpec]:
        """The outputs as the pipeline's answer to one request has them: a decoupled
        pipeline's each with a leading response dimension before the declared ones."""
        if self.decoupled is None:
            return self.outputs
        return [spec.model_copy(update={"shape": [-1, *spec.shape]}) for spec in self.outputs]

    def stage_names(self) -> list[str]:
        """The first model's name, then each later stage's."""
        return [self.model.name, *(stage.label for stage in self.stages)]

    def stage_groups(self) -> list[list[Stage]]:
        """The stages in the order they run: each group at once (a stage and the parallel
        ones after it)."""
        groups: list[list[Stage]] = []
        for stage in self.stages:
            if stage.parallel and groups:
                groups[-1].append(stage)
            else:
                groups.append([stage])
        return groups

    def first_models(self) -> list[ModelRef]:
        """The models preprocess's outputs may feed: the first, and its fallback's."""
        return [self.model, *([self.fallback.model] if self.fallback else [])]

    def model_refs(self) -> list[ModelRef]:
        """Every model the pipeline may run: the first and its fallback's, then each
        stage's and its fallback's."""
        stages = [[s.model, *([s.fallback.model] if s.fallback else [])] for s in self.stages]
        return [*self.first_models(), *(model for models in stages for model in models)]

    @model_validator(mode="after")
    def _element_limit_of_the_first_step(self) -> Pipeline:
        """An input's unset max_element_bytes is the limit of the decode step reading it."""
        for spec in self.inputs:
            reader = next(
                (s for s in self.preprocess if getattr(s, "input", None) == spec.name), None
            )
            if isinstance(reader, DecodeStep) and "max_element_bytes" not in spec.model_fields_set:
                spec.max_element_bytes = reader.max_bytes
        return self

    @model_validator(mode="after")
    def _image_rank_fits_the_batch(self) -> Pipeline:
        """A rank-3 image has no batch dimension: only a pipeline without one may take it."""
        for spec in self.inputs:
            if spec.format is not None and len(spec.shape) == 3 and self.max_batch_size > 0:
                raise ValueError(
                    f"input {spec.name}: format {spec.format} on a rank-3 shape {spec.shape} "
                    "needs max_batch_size 0 (no batch dimension); with a batch, give rank 4, "
                    "batch first"
                )
        return self

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

    @property
    def batched(self) -> bool:
        """Whether every tensor's first dimension is a free batch dimension: Triton then
        describes it by max_batch_size, else the pipeline takes one fixed shape."""
        return all(spec.shape[0] == -1 for spec in [*self.inputs, *self.outputs])
