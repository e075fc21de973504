"""The model repository on disk: `<root>/<model>/model.yaml`, `<root>/<model>/<version>/`.

Shared by what writes entries (the converter, the demo-model builds) and what reads them
(the inference service).

A version folder holds `model.onnx` and optionally `validation/*.npz` golden cases. Version
folders are positive integers. A version's fingerprint changes whenever a file in its folder
or what model.yaml says of how it loads changes, which is how a reload or a poll tells what
is new.
"""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import numpy as np

from strata.errors import InvalidArgument, shown

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def is_name(name: str) -> bool:
    return bool(_NAME.fullmatch(name))


def check_name(name: str) -> str:
    """A model name that is one plain folder name (never a path out of the repository)."""
    if not _NAME.fullmatch(name):
        raise InvalidArgument(
            f"model name {shown(name)} must be letters, digits, '_', '.' or '-' "
            "(and not start with '.' or '-')"
        )
    return name


def models(root: Path) -> list[str]:
    """Every model folder in the repository, by name."""
    if not root.is_dir():
        return []
    return sorted(
        p.name for p in root.iterdir() if p.is_dir() and _NAME.fullmatch(p.name) and _is_model(p)
    )


def _is_model(folder: Path) -> bool:
    return (folder / "model.yaml").is_file() or bool(versions(folder))


def versions(folder: Path) -> dict[int, Path]:
    """The model's version folders by number."""
    if not folder.is_dir():
        return {}
    return {
        int(p.name): p
        for p in folder.iterdir()
        if p.is_dir() and p.name.isdigit() and int(p.name) > 0
    }


def fingerprint(version_folder: Path, loaded_with: str = "") -> str:
    """A digest of the size and modification time of every file in a version's folder, and
    of `loaded_with` (what the model's settings say of how this version loads)."""
    digest = hashlib.sha256(loaded_with.encode())
    for path in sorted(version_folder.rglob("*")):
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        if path.is_file():
            where = path.relative_to(version_folder.parent)
            digest.update(f"{where}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return digest.hexdigest()[:16]


# A fixed timestamp inside npz archives keeps their bytes the same on every build.
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)


def write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write arrays as an npz that `np.load` reads, byte-identical for identical arrays.

    Validation cases (`<version>/validation/*.npz`) are written this way by every producer.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
            info = zipfile.ZipInfo(f"{name}.npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, buffer.getvalue())
