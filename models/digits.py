"""Handwritten digits: an MLP over 8x8 grayscale images sent as UINT8 0..255."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from models.common import SEED, TEST_SIZE, BuiltModel, StepSpec, run_steps
from models.onnx_export import dense_model

NAME = "digits"
LARGE = "digits-large"
# The same steps, with the same options, as the serving config's digits pipeline.
STEPS: list[StepSpec] = [
    ("resize", {"input": "images", "height": 8, "width": 8, "interpolation": "area"}),
    ("scale", {"input": "images", "factor": 0.00392156862745098}),
    ("flatten", {"input": "images", "output": "pixels"}),
]


def client_images() -> tuple[np.ndarray, np.ndarray]:
    """The dataset as clients send it: UINT8 [N, 8, 8] in 0..255, with int64 labels."""
    # scikit-learn only here and in train: importing the module (its STEPS) should not cost
    # seconds, as it did in every process that collects the tests.
    from sklearn.datasets import load_digits

    data = load_digits()
    images = np.round(data.data.reshape(-1, 8, 8) * 255 / 16).astype(np.uint8)
    return images, data.target.astype(np.int64)


def build(repository: Path) -> BuiltModel:
    """Version 1: 64 hidden units."""
    return train(repository, version="1", hidden=(64,), seed=SEED)


def build_v2(repository: Path) -> BuiltModel:
    """Version 2, the A/B canary: a wider hidden layer from another seed."""
    return train(repository, version="2", hidden=(128,), seed=SEED + 1)


def build_large(repository: Path) -> BuiltModel:
    """digits-large, a cascade's second stage: three hidden layers of 1024 units, about 450
    times the arithmetic of version 1 per row, and a little more accurate."""
    return train(repository, version="1", hidden=(1024, 1024, 1024), seed=SEED, name=LARGE)


def train(
    repository: Path, version: str, hidden: tuple[int, ...], seed: int, name: str = NAME
) -> BuiltModel:
    """Train on the serving steps' features and export the MLP's raw logits."""
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    images, labels = client_images()
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels, test_size=TEST_SIZE, stratify=labels, random_state=SEED
    )
    train_features = run_steps(STEPS, {"images": train_x}, repository)["pixels"]
    test_features = run_steps(STEPS, {"images": test_x}, repository)["pixels"]
    classifier = MLPClassifier(hidden_layer_sizes=hidden, max_iter=400, random_state=seed)
    classifier.fit(train_features, train_y)
    layers = list(zip(classifier.coefs_, classifier.intercepts_, strict=True))
    return BuiltModel(
        name=name,
        version=version,
        graph=dense_model(layers, "pixels", "logits"),
        labels=[str(digit) for digit in range(10)],
        train_size=len(train_y),
        test_inputs={"pixels": test_features},
        test_labels=test_y,
        sklearn_predictions=classifier.predict(test_features),
        client_test={"images": test_x, "labels": test_y},
        # Both versions serve, so the A/B arms can each name one.
        config={"version_policy": {"all": True}},
    )
