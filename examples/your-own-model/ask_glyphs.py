"""Ask the glyphs pipeline about held-out digits, drawn 32x32 in a 4-pixel frame (40x40),
over the gateway's REST API.

    python ask_glyphs.py 127.0.0.1:8000
"""

from __future__ import annotations

import json
import sys
import urllib.request

import numpy as np
from sklearn.datasets import load_digits


def framed(images: np.ndarray) -> np.ndarray:
    """8x8 digits (ink 0..16) as UINT8 40x40 images: each pixel 4x4, a blank 4-pixel frame."""
    ink = np.rint(images * 255 / 16).astype(np.uint8)
    big = ink.repeat(4, axis=1).repeat(4, axis=2)
    return np.pad(big, ((0, 0), (4, 4), (4, 4)))


def main(address: str, first: int = 1500, rows: int = 4) -> None:
    data = load_digits()
    images, truth = framed(data.images[first : first + rows]), data.target[first : first + rows]
    body = {
        "inputs": [
            {
                "name": "images",
                "datatype": "UINT8",
                "shape": list(images.shape),
                "data": images.ravel().tolist(),
            }
        ]
    }
    request = urllib.request.Request(
        f"http://{address}/v2/models/glyphs/infer",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as reply:
        outputs = {o["name"]: o["data"] for o in json.load(reply)["outputs"]}
    for digit, answer, score in zip(truth, outputs["digit"], outputs["score"], strict=True):
        print(f"{digit}: answered {answer} ({score:.2f})")


if __name__ == "__main__":
    main(sys.argv[1])
