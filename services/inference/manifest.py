"""`<repository>/<model>/model.yaml`, typed: what the ONNX graph does not say about a model.

Inputs and outputs come from the graph. model.yaml adds the max batch size, which versions
serve (Triton's version policy: the latest N, all, or specific ones), which inputs are padded
when requests of different lengths share a batch, overrides of the deployment's session
and batching defaults, and the fingerprint of the statistics each version was trained with.
Keys other layers read (labels) are kept.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from strata import yamltext
from strata.config.inference import InferenceSettings
from strata.errors import NotReady
from strata.wire.triton_sequences import ModelSequence


class VersionPolicy(BaseModel):
    """Which version folders serve: exactly one of `latest`, `all` or `specific`."""

    model_config = ConfigDict(extra="forbid")

    latest: int | None = Field(default=None, gt=0, description="The N highest versions.")
    all: bool = Field(default=False, description="Every version folder.")
    specific: list[int] | None = Field(
        default=None, min_length=1, description="Exactly these versions."
    )

    @model_validator(mode="after")
    def _one_kind(self) -> VersionPolicy:
        chosen = [self.latest is not None, self.all, self.specific is not None]
        if sum(chosen) > 1:
            raise ValueError("set only one of latest, all and specific")
        if not any(chosen):
            self.latest = 1
        return self

    def select(self, available: Sequence[int]) -> list[int]:
        """The versions to serve among `available`, ascending."""
        ordered = sorted(available)
        if self.all:
            return ordered
        if self.specific is not None:
            return [v for v in ordered if v in set(self.specific)]
        return ordered[-(self.latest or 1) :]


class ModelManifest(BaseModel):
    """model.yaml. Unknown keys are allowed: other layers keep their own settings here."""

    model_config = ConfigDict(extra="allow")

    platform: str = Field(default="onnxruntime_onnx", description="Only ONNX models are served.")
    max_batch_size: int = Field(default=64, gt=0, description="Most rows one batch may hold.")
    version_policy: VersionPolicy = Field(
        default_factory=VersionPolicy, description="Which versions serve (default: latest 1)."
    )
    padding: dict[str, float] = Field(
        default_factory=dict,
        description="Inputs whose open dimensions pad to the longest in a batch, with the "
        "value to pad with (0 for masks).",
    )
    session: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of inference.session for this model."
    )
    batching: dict[str, Any] = Field(
        default_factory=dict, description="Overrides of inference.batching for this model."
    )
    preprocess_fingerprint: str | dict[int, str] | None = Field(
        default=None,
        description="The fingerprint of the statistics the model was trained with (fit-stats "
        "writes it into stats.json): one for every version, or one per version number. A "
        "version folder whose stats.json has another is refused; preprocess checks the stats "
        "it feeds each version against it.",
    )
    sequence: ModelSequence | None = Field(
        default=None,
        description="The model is stateful: its control inputs and implicit state "
        "(services/inference/sequences.py).",
    )


class ModelSpec:
    """A model's manifest with the deployment's defaults filled in, validated."""

    def __init__(
        self,
        manifest: ModelManifest,
        session: InferenceSettings.Session,
        batching: InferenceSettings.Batching,
        workers: int,
    ) -> None:
        self.manifest = manifest
        self.max_batch_size = manifest.max_batch_size
        self.version_policy = manifest.version_policy
        self.padding = manifest.padding
        self.sequence = manifest.sequence
        self.session = session
        self.batching = batching
        self.concurrency = batching.max_concurrent_batches or workers

    def trained_stats(self, version: int) -> str | None:
        """The fingerprint of the statistics `version` was trained with, if recorded."""
        recorded = self.manifest.preprocess_fingerprint
        return recorded.get(version) if isinstance(recorded, dict) else recorded

    def stamp(self, version: int) -> str:
        """What of model.yaml (and the deployment's defaults) `version` is loaded with: when
        it changes the version reloads; the version policy, other versions' entries and
        other layers' keys (labels) leave it serving, its counters kept."""
        loaded_with = [
            self.max_batch_size,
            self.padding,
            self.session.model_dump(),
            self.batching.model_dump(),
            self.trained_stats(version),
            self.sequence.model_dump() if self.sequence is not None else None,
        ]
        return json.dumps(loaded_with, sort_keys=True)


def read_spec(path: Path, defaults: InferenceSettings) -> ModelSpec:
    """Read and validate a model.yaml; NotReady names the file (as the repository has it,
    never the server's path to it) and the field when it is bad."""
    where = f"{path.parent.name}/{path.name}"
    try:
        raw = yamltext.safe_load(path.read_text()) if path.exists() else {}
    except OSError as exc:
        raise NotReady(f"cannot read {where}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise NotReady(f"cannot read {where}: {exc}") from None
    if not isinstance(raw, dict):
        raise NotReady(f"{where} must be a mapping")
    manifest = _validate(where, "", ModelManifest, raw)
    if manifest.platform != "onnxruntime_onnx":
        raise NotReady(f"{where}: platform {manifest.platform!r} is not onnxruntime_onnx")
    session = _validate(
        where,
        "session.",
        InferenceSettings.Session,
        {**defaults.session.model_dump(), **manifest.session},
    )
    batching = _validate(
        where,
        "batching.",
        InferenceSettings.Batching,
        {**defaults.batching.model_dump(), **manifest.batching},
    )
    return ModelSpec(manifest, session, batching, defaults.workers)


M = TypeVar("M", bound=BaseModel)


def _validate(where: str, section: str, model: type[M], raw: dict[str, Any]) -> M:
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"{section}{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        )
        raise NotReady(f"{where} is invalid: {problems}") from None
