"""Writing the model-repository entry: model.yaml, the version folder, validation cases.

```
<repository>/<model>/model.yaml
<repository>/<model>/<version>/model.onnx
<repository>/<model>/<version>/validation/case_NNN.npz   input.<name>, output.<name>, atol, rtol
<repository>/<model>/<version>/conversion.yaml           how it was made and its parity
<repository>/<model>/<version>/<extra files>             e.g. tokenizer.json
```

The version folder is filled under a hidden name and renamed into place, so an inference
service polling the repository never sees half an entry. model.yaml keeps keys it already
has (session or batching overrides someone set) and takes the ones the conversion knows.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from strata.convert.source import ConversionError
from strata.errors import InvalidArgument
from strata.models import repository
from strata.models.repository import write_npz
from strata.wire.codec import Arrays


def check_name(name: str) -> str:
    """A model name the inference service accepts as a repository folder."""
    try:
        return repository.check_name(name)
    except InvalidArgument as exc:
        raise ConversionError(str(exc)) from None


def versions(model_folder: Path) -> list[int]:
    return sorted(repository.versions(model_folder))


def choose_version(model_folder: Path, version: int | None, overwrite: bool) -> int:
    """The version to write: the one asked for, or one past the highest there is."""
    existing = versions(model_folder)
    if version is None:
        return (existing[-1] if existing else 0) + 1
    if version < 1:
        raise ConversionError(f"version must be a positive integer, got {version}")
    if version in existing and not overwrite:
        raise ConversionError(
            f"{model_folder / str(version)} exists; versions are immutable, so pick another "
            "--version or pass --overwrite"
        )
    return version


def case_arrays(inputs: Arrays, outputs: Arrays, atol: float) -> dict[str, np.ndarray]:
    """One validation case in the repository's format."""
    arrays = {f"input.{name}": value for name, value in inputs.items()}
    arrays |= {f"output.{name}": value for name, value in outputs.items()}
    # rtol 0: the case holds the model to exactly the absolute bound parity accepted it at.
    bounds = {"atol": np.asarray(atol, np.float64), "rtol": np.asarray(0.0, np.float64)}
    return arrays | bounds  # 0-d arrays: stored as np.float64 scalars would be


def write_entry(
    model_folder: Path,
    version: int,
    model: Path,
    cases: Sequence[dict[str, np.ndarray]],
    files: dict[str, Path],
    manifest: dict[str, Any],
    report: dict[str, Any],
) -> Path:
    """Write model.yaml and the version folder; returns the version folder."""
    model_folder.mkdir(parents=True, exist_ok=True)
    staging = model_folder / f".staging-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _fill(staging, model, cases, files, report)
        update_manifest(model_folder / "model.yaml", manifest)
        return _install(staging, model_folder / str(version))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fill(
    folder: Path,
    model: Path,
    cases: Sequence[dict[str, np.ndarray]],
    files: dict[str, Path],
    report: dict[str, Any],
) -> None:
    (folder / "validation").mkdir(parents=True)
    shutil.copyfile(model, folder / "model.onnx")
    for index, arrays in enumerate(cases):
        write_npz(folder / "validation" / f"case_{index:03d}.npz", arrays)
    for name, path in files.items():
        shutil.copyfile(path, folder / name)
    _write_yaml(folder / "conversion.yaml", report)


def update_manifest(path: Path, keys: dict[str, Any]) -> None:
    """Set `keys` in model.yaml, keeping every other key it has."""
    current = yaml.safe_load(path.read_text()) if path.exists() else {}
    if not isinstance(current, dict):
        raise ConversionError(f"{path} exists but is not a mapping; fix or remove it")
    _write_yaml(path, {**current, **keys})


def _install(staging: Path, target: Path) -> Path:
    if not target.exists():
        staging.rename(target)
        return target
    replaced = target.with_name(f".replaced-{target.name}-{os.getpid()}")
    target.rename(replaced)
    staging.rename(target)
    shutil.rmtree(replaced)
    return target


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(yaml.safe_dump(data, sort_keys=False, allow_unicode=True))
    os.replace(partial, path)
