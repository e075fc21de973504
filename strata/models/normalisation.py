"""Normalisation statistics: computed once from training data, loaded once at start-up.

The file carries a fingerprint of its values, so a pipeline can refuse to feed a model that
was trained with other statistics. A model version that was trained with its own keeps them
in its folder as `stats.json`, where the inference service checks them when it loads it.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

STATS_FILE = "stats.json"  # a version's own statistics, in its folder


@dataclass(frozen=True)
class Stats:
    """Per-feature mean and standard deviation (float32)."""

    mean: np.ndarray
    std: np.ndarray

    @property
    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(self.mean, dtype="<f4").tobytes())
        digest.update(np.ascontiguousarray(self.std, dtype="<f4").tobytes())
        return "sha256:" + digest.hexdigest()[:16]


def fit_stats(data: np.ndarray) -> Stats:
    """Mean and std per column of `data` [rows, features]; a constant column keeps std 1.

    Sums run in float64 whatever the input type, so a float32 copy of the same data gives
    the same statistics (and fingerprint).
    """
    if data.ndim != 2 or data.shape[0] == 0 or data.shape[1] == 0:
        raise ValueError(f"data must be [rows, features] with both above 0, got {list(data.shape)}")
    if data.dtype.kind not in "biuf":
        raise ValueError(f"data must be numeric, got {data.dtype}")
    wide = data.astype(np.float64)
    if not np.isfinite(wide).all():
        row, column = np.argwhere(~np.isfinite(wide))[0]
        raise ValueError(f"data has NaN or infinity (row {row}, column {column})")
    mean = wide.mean(axis=0).astype(np.float32)
    std = wide.std(axis=0).astype(np.float32)
    std[std == 0] = 1.0
    return Stats(mean=mean, std=std)


def save_stats(stats: Stats, path: Path) -> None:
    """Write the stats file (JSON: mean, std, fingerprint), creating its folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "mean": stats.mean.tolist(),
        "std": stats.std.tolist(),
        "fingerprint": stats.fingerprint,
    }
    path.write_text(json.dumps(body, indent=1) + "\n")


def load_stats(path: Path) -> Stats:
    """Load a stats file, checking that its values still match its fingerprint."""
    body = json.loads(path.read_text())
    if not isinstance(body, dict) or not {"mean", "std"} <= set(body):
        raise ValueError(f"{path}: a stats file holds mean and std (see fit-stats)")
    stats = Stats(
        mean=np.asarray(body["mean"], dtype=np.float32),
        std=np.asarray(body["std"], dtype=np.float32),
    )
    if stats.mean.shape != stats.std.shape or stats.mean.ndim != 1:
        raise ValueError(f"{path}: mean and std must be lists of the same length")
    if body.get("fingerprint") != stats.fingerprint:
        raise ValueError(f"{path}: fingerprint does not match its values (file edited?)")
    return stats
