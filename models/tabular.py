"""Breast cancer diagnosis: logistic regression over 30 standardised numeric features."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.common import SEED, TEST_SIZE, BuiltModel, StepSpec, run_steps
from models.onnx_export import dense_model
from strata.models.normalisation import fit_stats, save_stats

NAME = "tabular"
STATS_PATH = "tabular/1/stats.json"


def steps(fingerprint: str) -> list[StepSpec]:
    """The serving config's tabular pipeline, pinned to the statistics the model was fit on."""
    options = {"input": "features", "stats": STATS_PATH, "fingerprint": fingerprint}
    return [("standardize", options)]


def logit_layer(coef: np.ndarray, intercept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Binary logistic regression as logits [0, z]; softmax gives [1 - sigmoid(z), sigmoid(z)]."""
    weight = np.concatenate([np.zeros_like(coef), coef]).T
    bias = np.concatenate([np.zeros_like(intercept), intercept])
    return weight, bias


def build(repository: Path) -> BuiltModel:
    """Fit statistics on the train split, save them, and train on the standardised features."""
    # scikit-learn only here: importing the module (its steps) should not cost seconds.
    from sklearn.datasets import load_breast_cancer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import train_test_split

    data = load_breast_cancer()
    features = data.data.astype(np.float32)
    labels = data.target.astype(np.int64)
    train_x, test_x, train_y, test_y = train_test_split(
        features, labels, test_size=TEST_SIZE, stratify=labels, random_state=SEED
    )
    stats = fit_stats(train_x)
    save_stats(stats, repository / STATS_PATH)
    serving = steps(stats.fingerprint)
    train_features = run_steps(serving, {"features": train_x}, repository)["features"]
    test_features = run_steps(serving, {"features": test_x}, repository)["features"]
    classifier = LogisticRegression(max_iter=1000, random_state=SEED)
    classifier.fit(train_features, train_y)
    layer = logit_layer(classifier.coef_, classifier.intercept_)
    return BuiltModel(
        name=NAME,
        graph=dense_model([layer], "features", "logits"),
        labels=[str(name) for name in data.target_names],
        train_size=len(train_y),
        test_inputs={"features": test_features},
        test_labels=test_y,
        sklearn_predictions=classifier.predict(test_features),
        client_test={"features": test_x, "labels": test_y},
        config={"preprocess_fingerprint": stats.fingerprint},
    )
