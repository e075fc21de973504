"""Image preprocessing against the library itself: `python -m bench.images [--rounds 7]`.

One 640x480 JPEG through decode -> resize (shorter side 256, bilinear) -> centre crop 224 ->
ImageNet normalise -> CHW, run by the preprocess service's own pipeline (PreprocessPipeline
with the built-in steps, in this process: the steps' cost without the gRPC hop), and the same
transform in-process by Pillow plus numpy, as a torchvision user would write it (torchvision's
transforms too where it is installed). Rounds alternate the two; each reports CPU time per
image, at one image a call and at a flight of 8 stacked. The goal (issue 26): the service's
per-image cost at most 1.5x the reference's, and its pixels equal the reference's within 1/255.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

from services.preprocess.pipeline import PreprocessPipeline
from services.preprocess.steps import build_step_options

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
STEPS = [
    ("decode", {"input": "image", "mode": "RGB"}),
    ("resize", {"input": "image", "shorter": 256, "interpolation": "bilinear"}),
    ("crop", {"input": "image", "height": 224, "width": 224}),
    ("normalize", {"input": "image", "mean": list(MEAN), "std": list(STD), "scale": 1 / 255}),
    ("layout", {"input": "image", "to": "CHW"}),
]
GOAL_RATIO = 1.5


def photo_jpeg(width: int = 640, height: int = 480) -> bytes:
    """A deterministic photo-like JPEG: smooth gradients with fine detail, quality 90."""
    fractal = Image.effect_mandelbrot((width, height), (-2.2, -1.2, 1.0, 1.2), 64)
    noise = Image.effect_noise((width, height), 24)
    gradient = Image.linear_gradient("L").resize((width, height))
    image = Image.merge("RGB", (fractal, noise, gradient))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def service_pipeline() -> PreprocessPipeline:
    steps = [(kind, build_step_options(kind, options, Path("."))) for kind, options in STEPS]
    return PreprocessPipeline(name="images", steps=steps)


def reference(data: bytes) -> np.ndarray:
    """Pillow and numpy: what torchvision's Resize, CenterCrop, ToTensor, Normalize do."""
    image = Image.open(io.BytesIO(data)).convert("RGB")
    width, height = image.size
    short, long = (height, width) if height <= width else (width, height)
    new_long = int(256 * long / short)
    size = (new_long, 256) if height <= width else (256, new_long)
    image = image.resize(size, Image.Resampling.BILINEAR)
    left, top = round((size[0] - 224) / 2.0), round((size[1] - 224) / 2.0)
    image = image.crop((left, top, left + 224, top + 224))
    pixels = np.asarray(image, dtype=np.float32) / 255
    normalised = (pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)
    return np.ascontiguousarray(normalised.transpose(2, 0, 1))


def torchvision_reference() -> Callable[[bytes], np.ndarray] | None:
    try:
        from torchvision import transforms  # type: ignore[import-not-found]
    except ImportError:
        return None
    pipeline = transforms.Compose(
        [
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize(MEAN, STD),
        ]
    )
    return lambda data: pipeline(Image.open(io.BytesIO(data)).convert("RGB")).numpy()


def per_image_ms(call: Callable[[], object], images: int, seconds: float) -> float:
    """CPU milliseconds per image of `call` (which handles `images`), over about `seconds`."""
    call()
    calls, start_wall, start_cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start_wall < seconds:
        call()
        calls += 1
    return (time.process_time() - start_cpu) * 1000 / (calls * images)


def batch_of(data: bytes, size: int) -> np.ndarray:
    items = np.empty(size, dtype=object)
    items[:] = [data] * size
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    args = parser.parse_args()
    data = photo_jpeg()
    pipeline = service_pipeline()
    ours = pipeline.run({"image": batch_of(data, 1)})["image"][0]
    expected = reference(data)
    worst = float(np.max(np.abs(ours - expected) * np.array(STD)[:, None, None]))
    print(f"JPEG 640x480, {len(data)} bytes; output {list(ours.shape)} {ours.dtype}")
    print(f"largest pixel difference from Pillow: {worst * 255:.3f}/255 (goal <= 1/255)")
    contenders: dict[str, Callable[[int], Callable[[], object]]] = {
        "service": lambda n: lambda: pipeline.run({"image": batch_of(data, n)}),
        "pillow": lambda n: lambda: [reference(data) for _ in range(n)],
    }
    vision = torchvision_reference()
    if vision is not None:
        contenders["torchvision"] = lambda n: lambda: [vision(data) for _ in range(n)]
    for flight in (1, 8):
        figures: dict[str, list[float]] = {name: [] for name in contenders}
        for _ in range(args.rounds):
            for name, make in contenders.items():
                figures[name].append(per_image_ms(make(flight), flight, args.seconds))
        medians = {name: statistics.median(values) for name, values in figures.items()}
        ratio = medians["service"] / medians["pillow"]
        row = ", ".join(f"{name} {ms:.2f} ms" for name, ms in medians.items())
        verdict = "meets" if ratio <= GOAL_RATIO else "misses"
        print(
            f"flight of {flight}: CPU per image {row}; service/pillow {ratio:.2f}x ({verdict} "
            f"the {GOAL_RATIO}x goal)"
        )


if __name__ == "__main__":
    main()
