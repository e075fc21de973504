"""Split scikit-learn's wine data set: the training rows (for the statistics and the model)
and the test rows (for the golden cases and for asking the served model).

    python prepare.py data        # writes data/train.npz and data/test.npz
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from sklearn.datasets import load_wine
from sklearn.model_selection import train_test_split


def main(folder: Path) -> None:
    data = load_wine()
    features = data.data.astype(np.float32)
    train_x, test_x, train_y, test_y = train_test_split(
        features, data.target, test_size=0.25, stratify=data.target, random_state=0
    )
    folder.mkdir(parents=True, exist_ok=True)
    np.save(folder / "train-features.npy", train_x)
    np.savez(folder / "train.npz", features=train_x, labels=train_y)
    np.savez(folder / "test.npz", features=test_x, labels=test_y)
    print(f"{len(train_x)} training rows, {len(test_x)} test rows, {features.shape[1]} features")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
