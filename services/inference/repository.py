"""The model repository: `<root>/<model>/model.yaml` and `<root>/<model>/<version>/model.onnx`.

Each version folder may hold `validation/*.npz` golden cases (arrays `input.<name>` and
`output.<name>`, scalars `atol` and `rtol`). A version is loaded, checked against its cases
and warmed before it serves; one that fails its cases never serves.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from services.inference.model import LoadedModel, SessionOptions, open_session
from strata.errors import NotFound, NotReady

log = logging.getLogger(__name__)


@dataclass
class Case:
    """A golden case: inputs, the outputs they must give, and the tolerance."""

    name: str
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]
    atol: float
    rtol: float


def read_cases(folder: Path) -> list[Case]:
    cases = []
    for path in sorted(folder.glob("*.npz")):
        with np.load(path) as data:
            cases.append(
                Case(
                    name=path.stem,
                    inputs=_prefixed(data, "input."),
                    outputs=_prefixed(data, "output."),
                    atol=float(data["atol"]),
                    rtol=float(data["rtol"]),
                )
            )
    return cases


def _prefixed(data: np.lib.npyio.NpzFile, prefix: str) -> dict[str, np.ndarray]:
    return {key[len(prefix) :]: data[key] for key in data.files if key.startswith(prefix)}


def validate(model: LoadedModel, cases: list[Case]) -> None:
    """Raise NotReady unless every case reproduces within its tolerance."""
    for case in cases:
        got = model.run(case.inputs)
        for name, expected in case.outputs.items():
            if not np.allclose(got[name], expected, atol=case.atol, rtol=case.rtol):
                worst = float(np.max(np.abs(got[name] - expected)))
                raise NotReady(
                    f"model {model.name!r} version {model.version}: validation case "
                    f"{case.name!r} output {name!r} differs by {worst:.3g}"
                )


def latest_version(root: Path, name: str) -> str:
    folder = root / name
    versions = sorted(int(p.name) for p in folder.glob("*") if p.name.isdigit() and p.is_dir())
    if not versions:
        raise NotFound(f"model {name!r}: no version folders under {folder}")
    return str(versions[-1])


def load_model(root: Path, name: str, options: SessionOptions) -> LoadedModel:
    """Load the latest version of `name`: open, validate against its cases, warm."""
    version = latest_version(root, name)
    config = yaml.safe_load((root / name / "model.yaml").read_text()) or {}
    folder = root / name / version
    model = LoadedModel(
        name=name,
        version=version,
        session=open_session(folder / "model.onnx", options),
        max_batch_size=int(config.get("max_batch_size", 64)),
    )
    cases = read_cases(folder / "validation")
    validate(model, cases)  # running the cases also warms the session
    if not cases:
        model.run(model.zeros())
    log.info("model %s version %s ready (%d validation cases)", name, version, len(cases))
    return model
