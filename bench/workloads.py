"""What the suite sends for each pipeline, at each layer, and the model version behind it.

A pipeline's requests are rows of its demo data set (build/data/<pipeline>_test.npz), one row
each, pinned to the pipeline's first A/B arm (`strata.arm`), so every request takes the same
route. The inference service alone gets that arm's model version, fed the rows of the version's
golden cases (already preprocessed), and the ceiling runs that version's ONNX file in this
process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.load.data import DATASETS, from_arrays
from services.inference import validation
from services.inference.manifest import ModelSpec, read_spec
from strata.config import Settings
from strata.models import repository
from strata.wire import codec
from strata.wire.codec import Arrays


@dataclass(frozen=True)
class Workload:
    pipeline: str
    model: str
    version: str  # the routed version ("" if the model's latest)
    deployment: str  # the inference deployment the arm calls
    arm: str
    objective_seconds: float  # the pipeline's latency objective (goodput counts within it)
    pipeline_requests: tuple[bytes, ...]
    model_requests: tuple[bytes, ...]
    folder: Path  # the version's folder, for the in-process ceiling
    spec: ModelSpec
    sample: Arrays  # one row of model inputs


def has_dataset(pipeline: str) -> bool:
    return (DATASETS / f"{pipeline}_test.npz").is_file()


def workload(settings: Settings, pipeline: str) -> Workload:
    """Everything the suite needs to load one pipeline and the model behind it."""
    spec_of_pipeline = settings.pipelines[pipeline]
    route = settings.routes(pipeline)[0]
    model = spec_of_pipeline.model.name
    version = route.version or spec_of_pipeline.model.version
    root = settings.repository / repository.check_name(model)
    spec = read_spec(root / "model.yaml", settings.inference)
    folder = _version_folder(root, spec, version)
    cases = validation.read_cases(folder / "validation")
    if not cases:
        raise SystemExit(f"model {model!r} has no validation cases to take requests from")
    rows = {k: np.concatenate([c.inputs[k] for c in cases]) for k in cases[0].inputs}
    inputs = _dataset(pipeline, {t.name: t.datatype for t in spec_of_pipeline.inputs})
    return Workload(
        pipeline=pipeline,
        model=model,
        version=version,
        deployment=route.deployment,
        arm=route.arm,
        objective_seconds=spec_of_pipeline.latency_objective_ms / 1000,
        pipeline_requests=tuple(
            from_arrays(pipeline, inputs, parameters={"strata.arm": route.arm})
        ),
        model_requests=tuple(_model_requests(model, version, rows)),
        folder=folder,
        spec=spec,
        sample={k: v[:1] for k, v in rows.items()},
    )


def _version_folder(root: Path, spec: ModelSpec, version: str) -> Path:
    available = repository.versions(root)
    if version:
        folder = available.get(int(version))
        if folder is None:
            raise SystemExit(f"{root.name} has no version {version} in {root}")
        return folder
    return available[spec.version_policy.select(list(available))[-1]]


def _dataset(pipeline: str, inputs: dict[str, str]) -> Arrays:
    with np.load(DATASETS / f"{pipeline}_test.npz", allow_pickle=False) as npz:
        return {name: npz[name].astype(codec.DTYPES[dtype]) for name, dtype in inputs.items()}


def _model_requests(model: str, version: str, rows: Arrays) -> list[bytes]:
    count = len(next(iter(rows.values())))
    return [
        codec.build_request(
            model, {k: v[i : i + 1] for k, v in rows.items()}, version
        ).SerializeToString()
        for i in range(count)
    ]
