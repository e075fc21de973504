"""What the plugin path costs per flight against the same code built in (docs/plugins.md).

Two preprocess pipelines differ only in their first step: the built-in `resize`, or
tests.support.plugins:Resize, the built-in's own class loaded as a plugin (so the guard is
all that differs). Each flight goes through `strata.calls.v1process` as the preprocess service runs
it (decode, the steps, stack, encode), alternating the two pipelines; the medians are printed.

    .venv/bin/python scripts/plugin_cost.py [--rows 1 16 64] [--repeat 2000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from services.preprocess.pipeline import PreprocessPipelines, build_pipeline
from strata.calls.v1process import process_all
from strata.config.pipelines import Pipeline
from strata.proto.v1 import tensor_pb2 as v1
from tests.support.flight_requests import flight

RESIZE = {"input": "images", "height": 8, "width": 8, "interpolation": "area"}
KINDS = {"builtin": "resize", "plugin": "tests.support.plugins:Resize"}


def pipeline(kind: str) -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, 32, 32]}],
            "outputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
            "preprocess": [
                {"kind": kind, **RESIZE},
                {"kind": "scale", "input": "images", "factor": 1 / 255},
                {"kind": "flatten", "input": "images", "output": "pixels"},
            ],
            "model": {"name": "digits"},
        }
    )


def seconds_per_flight(pipelines: PreprocessPipelines, rows: int, repeat: int) -> dict[str, float]:
    """Median seconds of one flight of `rows` one-row members, per pipeline."""
    rng = np.random.default_rng(0)
    members = {
        f"m{i}": {"images": rng.integers(0, 256, (1, 32, 32), np.uint8)} for i in range(rows)
    }
    calls = {name: v1.ProcessRequest(requests=[flight(name, members)]) for name in KINDS}

    def handler(name, tensors, parameters):
        return pipelines.get(name).run(tensors), {}

    times: dict[str, list[float]] = {name: [] for name in KINDS}
    for _ in range(repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            process_all(call, handler)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    built = {name: build_pipeline(name, pipeline(kind), Path(".")) for name, kind in KINDS.items()}
    pipelines = PreprocessPipelines(built)
    print("rows  built-in µs  plugin µs  difference µs")
    for rows in args.rows:
        median = seconds_per_flight(pipelines, rows, args.repeat)
        builtin, plugin = median["builtin"] * 1e6, median["plugin"] * 1e6
        print(f"{rows:4d}  {builtin:11.1f}  {plugin:9.1f}  {plugin - builtin:13.1f}")


if __name__ == "__main__":
    main()
