"""Ask the wine pipeline about the first test rows, over the gateway's REST API.

python ask.py data 127.0.0.1:8000
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import numpy as np


def main(data: Path, address: str, rows: int = 4) -> None:
    with np.load(data / "test.npz") as test:
        features, labels = test["features"][:rows], test["labels"][:rows]
    body = {
        "inputs": [
            {
                "name": "features",
                "datatype": "FP32",
                "shape": list(features.shape),
                "data": features.ravel().tolist(),
            }
        ]
    }
    request = urllib.request.Request(
        f"http://{address}/v2/models/wine/infer",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        outputs = {o["name"]: o["data"] for o in json.load(reply)["outputs"]}
    for truth, cultivar, score in zip(labels, outputs["cultivar"], outputs["score"], strict=True):
        print(f"class_{truth}: answered {cultivar} ({score:.2f})")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
