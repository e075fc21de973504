"""A workload's ceiling: one Python process doing the steps and the model in a loop.

`python -m bench.peers.inprocess images --model FILE [--photo-size WxH]` runs
bench/peers/photo.py's steps and the model on one photo after another; `... text --model FILE
--tokenizer FILE` tokenises one sentence after another (bench/peers/sentences.py) for MiniLM.
ONNX Runtime on one thread, no server, no serialisation. It prints one JSON line: requests,
seconds, CPU seconds and each request's latency in ms. The peer benchmark starts one, then
two at once (a 2-core machine's ceiling).
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from collections.abc import Callable

import numpy as np
import onnxruntime

from bench.images import photo_jpeg
from bench.peers.photo import reference, top5
from bench.peers.sentences import features, tokenizer
from bench.text import SENTENCES


def session(model: str) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def images(args: argparse.Namespace) -> Callable[[], object]:
    run = session(args.model)
    name = run.get_inputs()[0].name
    photo = photo_jpeg(*(int(n) for n in args.photo_size.split("x")))
    return lambda: top5(run.run(None, {name: reference(photo)[np.newaxis]})[0])


def text(args: argparse.Namespace) -> Callable[[], object]:
    run, loaded = session(args.model), tokenizer(args.tokenizer)
    sentences = itertools.cycle(SENTENCES)
    return lambda: run.run(None, features(loaded, [next(sentences)]))


def loop(one: Callable[[], object], seconds: float) -> dict[str, object]:
    """`one` again and again for `seconds`: the figures."""
    latencies: list[float] = []
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        began = time.perf_counter()
        one()
        latencies.append((time.perf_counter() - began) * 1000)
    return {
        "requests": len(latencies),
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "latencies_ms": latencies,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workload", choices=("images", "text"))
    parser.add_argument("--model", required=True)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--photo-size", default="640x480", help="images: WIDTHxHEIGHT")
    parser.add_argument("--tokenizer", help="text: the tokenizer file")
    args = parser.parse_args()
    one = images(args) if args.workload == "images" else text(args)
    loop(one, 0.5)  # warm: the session's first runs
    print(json.dumps(loop(one, args.seconds)))


if __name__ == "__main__":
    main()
