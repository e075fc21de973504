"""Image preprocessing against the library itself: `python -m bench.images [--rounds 5]`.

One 640x480 JPEG through decode -> resize (shorter side 256, bilinear) -> centre crop 224 ->
ImageNet normalise -> CHW, run by the preprocess service, and the same transform in-process by
Pillow plus numpy, as a torchvision user would write it (torchvision's transforms too where it
is installed). The service is measured twice: its own pipeline (PreprocessPipeline with the
built-in steps) in this process, the steps' cost alone; and the real preprocess process
(`python -m services.preprocess`) called with strata.v1 Preprocess/Process, its CPU time read
from the process (psutil), which adds the gRPC hop: the JPEG in, a 150 KB UINT8 crop out (the
normalise and CHW steps are folded into the model, which inference runs). Rounds
alternate all of them; each reports CPU time per image, at one image a call and at a flight of
8 stacked. The goal (issue 26): the service's per-image cost at most 1.5x the reference's, and
its pixels equal the reference's within 1/255.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import yaml
from PIL import Image

from bench.peers.photo import MEAN, STD, reference
from services.preprocess.pipeline import PreprocessPipeline
from services.preprocess.steps import build_step_options
from strata.config import load_settings
from strata.proto.v1 import preprocess_pb2_grpc, tensor_pb2
from strata.tools.launch import ROOT, Supervisor
from strata.wire import codec

STEPS = [
    ("decode", {"input": "image", "mode": "RGB"}),
    ("resize", {"input": "image", "shorter": 256, "interpolation": "bilinear"}),
    ("crop", {"input": "image", "height": 224, "width": 224}),
    ("normalize", {"input": "image", "mean": list(MEAN), "std": list(STD), "scale": 1 / 255}),
    ("layout", {"input": "image", "to": "CHW"}),
]
GOAL_RATIO = 1.5
FLIGHTS = (1, 8)
PIPELINE = "images"


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


def per_image_ms(
    call: Callable[[], object], images: int, seconds: float, cpu: Callable[[], float]
) -> float:
    """CPU milliseconds (as `cpu` reads them) per image of `call`, which handles `images`,
    over about `seconds`."""
    call()
    calls, start_wall, start_cpu = 0, time.perf_counter(), cpu()
    while time.perf_counter() - start_wall < seconds:
        call()
        calls += 1
    return (cpu() - start_cpu) * 1000 / (calls * images)


def process_cpu(pid: int) -> Callable[[], float]:
    """The CPU seconds a process has used so far, as a reader."""
    process = psutil.Process(pid)
    return lambda: sum(process.cpu_times()[:2])


@contextlib.contextmanager
def preprocess_process(folder: Path) -> Iterator[tuple[Supervisor, str]]:
    """The real preprocess service alone, serving bench.image_chain's `images` pipeline: its
    normalise and CHW steps are folded into the stand-in model, so UINT8 crops come out."""
    from bench.image_chain import image_config  # image_chain builds on this module

    config = image_config(ROOT / "configs" / "default.yaml", folder)
    raw = yaml.safe_load(config.read_text())
    raw["services"]["preprocess"]["replicas"] = 1  # one process, whose CPU time is read
    config.write_text(yaml.safe_dump(raw))
    supervisor = Supervisor(config, load_settings(config), log_dir=folder)
    supervisor.start("preprocess")
    try:
        yield supervisor, supervisor.address("preprocess")
    finally:
        supervisor.stop_all()


def call_process(stub: preprocess_pb2_grpc.PreprocessStub, data: bytes, n: int) -> np.ndarray:
    """One Process call carrying `n` images stacked, as a flight's rows travel."""
    tensor = codec.to_tensor("image", batch_of(data, n))
    request = tensor_pb2.Request(id="bench", pipeline=PIPELINE, tensors=[tensor])
    reply = stub.Process(tensor_pb2.ProcessRequest(requests=[request]), timeout=30)
    result = reply.results[0]
    if result.HasField("error"):
        raise RuntimeError(f"the preprocess service refused the image: {result.error}")
    return codec.tensors_to_arrays(result.tensors)["image"]


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
    with tempfile.TemporaryDirectory() as folder, preprocess_process(Path(folder)) as (sup, at):
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        stub = preprocess_pb2_grpc.PreprocessStub(grpc.insecure_channel(at, options=options))
        pid = sup.processes["preprocess"].pid
        print(f"JPEG 640x480, {len(data)} bytes")
        check_pixels(data, stub)
        pipeline = service_pipeline()
        contenders: dict[str, Contender] = {
            "pipeline in process": (
                lambda n: lambda: pipeline.run({"image": batch_of(data, n)}),
                time.process_time,
            ),
            "preprocess process": (lambda n: lambda: call_process(stub, data, n), process_cpu(pid)),
            "pillow": (lambda n: lambda: [reference(data) for _ in range(n)], time.process_time),
        }
        vision = torchvision_reference()
        if vision is not None:
            contenders["torchvision"] = (
                lambda n: lambda: [vision(data) for _ in range(n)],
                time.process_time,
            )
        for flight in FLIGHTS:
            report(flight, measure(contenders, flight, args.rounds, args.seconds))


Contender = tuple[Callable[[int], Callable[[], object]], Callable[[], float]]


def check_pixels(data: bytes, stub: preprocess_pb2_grpc.PreprocessStub) -> None:
    expected = reference(data)
    for where, ours in (
        ("pipeline in process", service_pipeline().run({"image": batch_of(data, 1)})["image"][0]),
        ("preprocess process", folded_tail(call_process(stub, data, 1)[0])),
    ):
        worst = float(np.max(np.abs(ours - expected) * np.array(STD)[:, None, None]))
        print(
            f"{where}: output {list(ours.shape)} {ours.dtype}, largest pixel difference from "
            f"Pillow {worst * 255:.3f}/255 (goal <= 1/255)"
        )


def folded_tail(crop: np.ndarray) -> np.ndarray:
    """What the model does first with a UINT8 HWC crop: normalise, then CHW."""
    pixels = crop.astype(np.float32) / 255.0
    return ((pixels - np.array(MEAN, np.float32)) / np.array(STD, np.float32)).transpose(2, 0, 1)


def measure(
    contenders: dict[str, Contender], flight: int, rounds: int, seconds: float
) -> dict[str, float]:
    """Median CPU ms per image of each contender, the contenders alternated every round."""
    figures: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(rounds):
        for name, (make, cpu) in contenders.items():
            figures[name].append(per_image_ms(make(flight), flight, seconds, cpu))
    return {name: statistics.median(values) for name, values in figures.items()}


def report(flight: int, medians: dict[str, float]) -> None:
    row = ", ".join(f"{name} {ms:.2f} ms" for name, ms in medians.items())
    print(f"flight of {flight}: CPU per image: {row}")
    for name in ("pipeline in process", "preprocess process"):
        ratio = medians[name] / medians["pillow"]
        verdict = "meets" if ratio <= GOAL_RATIO else "misses"
        print(f"  {name} / pillow: {ratio:.2f}x ({verdict} the {GOAL_RATIO}x goal)")


if __name__ == "__main__":
    main()
