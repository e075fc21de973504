"""A compute-bound model for the batching benchmark, in a scratch copy of the repository.

The demo models run in tens of microseconds, so the service's own path bounds them whatever
the batching. `mlp` (256 -> 2048 -> 2048 -> 10, 19 MB of weights) is the other case: a batch
of one is bound by reading the weights, so a batch of 64 costs ten times, not 64 times, as
much, and the batching policy decides the throughput.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import yaml

from models.onnx_export import dense_model, session

NAME = "mlp"
SIZES = (256, 2048, 2048, 10)
MAX_BATCH_SIZE = 64
TOLERANCE = 1e-3


def write_repository(scratch: Path, source: Path, models: list[str]) -> Path:
    """A repository holding links to `models` in `source` and the synthetic `mlp`."""
    root = scratch / "repository"
    root.mkdir(parents=True)
    for name in models:
        (root / name).symlink_to(source / name, target_is_directory=True)
    _write_mlp(root / NAME)
    return root


def _write_mlp(folder: Path) -> None:
    rng = np.random.default_rng(0)
    layers = [
        (
            (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32),
            rng.normal(size=b).astype(np.float32) * 0.1,
        )
        for a, b in itertools.pairwise(SIZES)
    ]
    model = dense_model(layers, "x", "y")
    version = folder / "1"
    (version / "validation").mkdir(parents=True)
    (version / "model.onnx").write_bytes(model.SerializeToString())
    (folder / "model.yaml").write_text(yaml.safe_dump({"max_batch_size": MAX_BATCH_SIZE}))
    x = rng.normal(size=(4, SIZES[0])).astype(np.float32)
    (y,) = session(model).run(["y"], {"x": x})
    np.savez(
        version / "validation" / "case_000.npz",
        **{"input.x": x, "output.y": y},
        atol=np.float64(TOLERANCE),
        rtol=np.float64(TOLERANCE),
    )
