"""The image workload's ceiling: one Python process doing the steps and the model in a loop.

`python -m bench.peers.inprocess --model FILE --seconds S [--photo-size WxH]` runs
bench/peers/photo.py's steps and the model (ONNX Runtime, one thread) on one photo after
another, with no server and no serialisation, and prints one JSON line: images, seconds,
CPU seconds and each image's latency in ms. The peer benchmark starts one, then two at once
(a 2-core machine's ceiling).
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime

from bench.images import photo_jpeg
from bench.peers.photo import reference, top5


def session(model: str) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def loop(model: str, photo: bytes, seconds: float) -> dict[str, object]:
    """Photos through the steps and the model for `seconds`: the figures."""
    run = session(model)
    name = run.get_inputs()[0].name
    latencies: list[float] = []
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        (logits,) = run.run(None, {name: reference(photo)[np.newaxis]})
        top5(logits)
        latencies.append((time.perf_counter() - began) * 1000)
    return {
        "images": len(latencies),
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "latencies_ms": latencies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--photo-size", default="640x480", help="WIDTHxHEIGHT")
    args = parser.parse_args()
    width, height = (int(n) for n in args.photo_size.split("x"))
    photo = photo_jpeg(width, height)
    loop(args.model, photo, 0.5)  # warm: the session's first runs
    print(json.dumps(loop(args.model, photo, args.seconds)))


if __name__ == "__main__":
    main()
