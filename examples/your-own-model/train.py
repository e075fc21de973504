"""Train a wine classifier on standardised features and put it in a Strata repository.

    python train.py data repository/wine

Reads the statistics that `fit_stats` wrote into repository/wine/1/stats.json, so the model
learns on exactly what the `standardize` step will give it, and writes beside them:
model.onnx (exported with skl2onnx), validation/*.npz golden cases, and ../model.yaml with
the class labels and the statistics' fingerprint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import yaml
from skl2onnx import convert_sklearn
from skl2onnx.common.data_types import FloatTensorType
from sklearn.datasets import load_wine
from sklearn.linear_model import LogisticRegression


def standardise(features: np.ndarray, stats: dict) -> np.ndarray:
    """What the standardize step does: (x - mean) / std, in FP32."""
    mean, std = np.float32(stats["mean"]), np.float32(stats["std"])
    return ((features - mean) / std).astype(np.float32)


def main(data: Path, model: Path) -> None:
    version = model / "1"
    stats = json.loads((version / "stats.json").read_text())
    with np.load(data / "train.npz") as train, np.load(data / "test.npz") as test:
        train_x, train_y = standardise(train["features"], stats), train["labels"]
        test_x, test_y = standardise(test["features"], stats), test["labels"]
    classifier = LogisticRegression(max_iter=1000).fit(train_x, train_y)

    # zipmap False: probabilities as one FP32 [batch, classes] tensor, not a list of dicts.
    onnx_model = convert_sklearn(
        classifier,
        initial_types=[("features", FloatTensorType([None, train_x.shape[1]]))],
        options={id(classifier): {"zipmap": False}},
    )
    (version / "model.onnx").write_bytes(onnx_model.SerializeToString())

    # Golden cases: the model's inputs (standardised) and what scikit-learn answers.
    (version / "validation").mkdir(exist_ok=True)
    np.savez(
        version / "validation" / "test-rows.npz",
        **{
            "input.features": test_x[:8],
            "output.label": classifier.predict(test_x[:8]).astype(np.int64),
            "output.probabilities": classifier.predict_proba(test_x[:8]).astype(np.float32),
            "atol": 1e-5,
            "rtol": 1e-4,
        },
    )
    manifest = {
        "max_batch_size": 64,
        "labels": [str(name) for name in load_wine().target_names],
        "preprocess_fingerprint": stats["fingerprint"],
    }
    (model / "model.yaml").write_text(yaml.safe_dump(manifest, sort_keys=False))
    print(f"wrote {model}: test accuracy {classifier.score(test_x, test_y):.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
