"""A small PyTorch image model of the guide's own: a CNN that reads 8x8 handwritten digits.

    python glyphs.py train data          # trains on scikit-learn's digits, writes data/glyphs.pt
    strata convert glyphs --repository repository --module glyphs:source   # (PYTHONPATH: here)

`source()` is what `strata convert --module` calls: the trained module, its input and output,
real images to check the ONNX export against PyTorch (and to write as validation cases), and
the labels for model.yaml.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from strata.convert.source import Source, TensorDecl

WEIGHTS = Path("data/glyphs.pt")


class Glyphs(nn.Module):
    """images FP32 [batch, 8, 8], ink 0..1 -> logits FP32 [batch, 10]."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU()
        )
        self.classify = nn.Linear(32 * 8 * 8, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.classify(self.features(images.unsqueeze(1)).flatten(1))


def digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits as FP32 [n, 8, 8] images, ink 0..1, and their classes."""
    data = load_digits()
    return (data.images / 16.0).astype(np.float32), data.target


def train(folder: Path) -> None:
    torch.manual_seed(0)
    images, classes = digits()
    x, y = torch.from_numpy(images[:1500]), torch.from_numpy(classes[:1500])
    model = Glyphs()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(40):
        optimiser.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimiser.step()
    with torch.no_grad():
        held_out = model(torch.from_numpy(images[1500:])).argmax(1).numpy()
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), folder / WEIGHTS.name)
    print(f"held-out accuracy {(held_out == classes[1500:]).mean():.3f}")


def source() -> Source:
    """The trained model, for `strata convert --module glyphs:source`."""
    model = Glyphs()
    model.load_state_dict(torch.load(WEIGHTS))
    images, _ = digits()
    return Source(
        module=model.eval(),
        inputs=[TensorDecl("images", "float32", ("batch", 8, 8))],
        outputs=[TensorDecl("logits", "float32", ("batch", 10))],
        samples=[{"images": images[1500 : 1500 + n]} for n in (1, 4)],
        description="glyphs, a CNN over 8x8 digits",
        manifest={"labels": [str(d) for d in range(10)]},
    )


if __name__ == "__main__":
    if sys.argv[1:2] != ["train"]:
        sys.exit(__doc__)
    train(Path(sys.argv[2]))
