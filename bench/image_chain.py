"""An image pipeline through the whole chain: `python -m bench.image_chain [--seconds 8]`.

The system of a config (configs/default.yaml) plus an `images` pipeline: a 640x480 JPEG in
(BYTES), decode -> resize (shorter side 256, bilinear) -> centre crop 224 -> ImageNet
normalise -> CHW in preprocess (bench.images' steps), then `vision`, a stand-in image
classifier (global average pool and a dense layer to 1,000 classes, random weights: the
model's own cost is not the point), then softmax and top 5; `--portraits N` sends N requests
in 10 upright (480x640), so that flights mix both sizes. One client on one connection, closed
loop with no deadline (a client library's default), stepping from 1 to 16 to 64 in flight:
throughput, P50 and P99 at each, the preprocess processes' CPU per image meanwhile, the
requests that failed, counted from the moment of the step (each point's warm-up included: a
step in load must fail nothing), and those answered degraded; then every process's CPU per
answered request at each step (the gateway, each preprocess replica, each inference
deployment, postprocess: bench/peers/per_process.py).
The result cache is off (the same few photos again and again would be answered from it),
and `--objective-ms` sets the pipeline's latency objective where the ladder should not shed
load. Results go to `--out` (bench/results/image_chain.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper

from bench.deployment import bench_config, running, service_pids
from bench.images import PIPELINE, STEPS, photo_jpeg
from bench.load import LoadPool, Plan
from bench.load.worker import INFER
from bench.measure import closed
from bench.peers import cpu
from bench.peers.per_process import cpu_table
from strata.tools.launch import ROOT, Supervisor
from strata.wire import codec

RESULTS = Path(__file__).resolve().parent / "results"
MODEL = "vision"
CLASSES = 1000
MAX_BATCH = 16
CONCURRENCIES = (1, 16, 64)
WARM_SECONDS = 2.0
CLIENT = (("x-client-id", "strata-bench"),)
PHOTO = (640, 480)
Replicas = tuple[int, int] | None  # preprocess replicas and threads; None: the config's


def vision_model(folder: Path) -> None:
    """The stand-in classifier's repository entry: [N, 3, 224, 224] FP32 -> [N, 1000]."""
    rng = np.random.default_rng(7)
    weights = numpy_helper.from_array(rng.normal(size=(3, CLASSES)).astype(np.float32), "w")
    bias = numpy_helper.from_array(np.zeros(CLASSES, np.float32), "b")
    axes = numpy_helper.from_array(np.array([2, 3], np.int64), "axes")
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["image", "axes"], ["pooled"], keepdims=0),
            helper.make_node("MatMul", ["pooled", "w"], ["scaled"]),
            helper.make_node("Add", ["scaled", "b"], ["logits"]),
        ],
        MODEL,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, ["N", 3, 224, 224])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", CLASSES])],
        [weights, bias, axes],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    (folder / "1").mkdir(parents=True)
    onnx.save(model, folder / "1" / "model.onnx")
    manifest = {"platform": "onnxruntime_onnx", "max_batch_size": MAX_BATCH}
    (folder / "model.yaml").write_text(yaml.safe_dump(manifest))


def image_config(
    config: Path, folder: Path, objective_ms: float | None = None, preprocess: Replicas = None
) -> Path:
    """`config` with the `images` pipeline, over a repository that also holds the stand-in
    model (the demo models linked in); `objective_ms`: its latency objective, where not the
    default; `preprocess`: (replicas, preprocess.threads), where not the config's."""
    base = bench_config(config, folder, "x" * 32)
    raw = yaml.safe_load(base.read_text())
    built = (base.parent / raw["repository"]).resolve()
    repository = folder / "repository"
    repository.mkdir()
    for entry in built.iterdir():
        (repository / entry.name).symlink_to(entry)
    vision_model(repository / MODEL)
    raw["repository"] = str(repository)
    # The same few photos again and again: the ladder's cached answers would stand in for
    # the chain's work that this measures.
    raw.setdefault("gateway", {})["cache"] = {"max_entries": 0}
    raw["pipelines"][PIPELINE] = {
        "max_batch_size": MAX_BATCH,
        "inputs": [{"name": "image", "datatype": "BYTES", "shape": [-1]}],
        "outputs": [
            {"name": "scores", "datatype": "FP32", "shape": [-1, 5]},
            {"name": "classes", "datatype": "INT64", "shape": [-1, 5]},
        ],
        "preprocess": [{"kind": kind, **options} for kind, options in STEPS],
        "model": {"name": MODEL, "routes": [{"arm": "a", "deployment": "a", "version": "1"}]},
        "postprocess": [
            {"kind": "softmax", "input": "logits", "output": "probabilities"},
            {
                "kind": "topk",
                "input": "probabilities",
                "k": 5,
                "values": "scores",
                "indices": "classes",
            },
        ],
    }
    if objective_ms is not None:
        raw["pipelines"][PIPELINE]["latency_objective_ms"] = objective_ms
    if preprocess is not None:
        raw["services"]["preprocess"]["replicas"], threads = preprocess
        raw.setdefault("preprocess", {})["threads"] = threads
    # Its work is mostly decoding in preprocess: a flight for each replica to work on and
    # one in the rest of the chain (docs/gateway.md, Flights).
    raw["pipelines"][PIPELINE]["max_in_air"] = raw["services"]["preprocess"]["replicas"] + 1
    config = folder / "images.yaml"
    config.write_text(yaml.safe_dump(raw))
    return config


def photo_requests(portraits: int = 0, size: tuple[int, int] = PHOTO) -> tuple[bytes, ...]:
    """Ten v2 requests of one `size` (width, height) JPEG each, `portraits` of them upright."""
    width, height = size
    return tuple(
        codec.build_request(
            PIPELINE, {"image": np.array([photo_jpeg(*shape)], dtype=object)}
        ).SerializeToString()
        for shape in [(height, width)] * portraits + [(width, height)] * (10 - portraits)
    )


def measure(
    config: Path,
    seconds: float,
    objective_ms: float | None = None,
    portraits: int = 0,
    size: tuple[int, int] = PHOTO,
) -> str:
    """The table; `portraits`: of every 10 requests, how many send the photo upright, so that
    flights carry photos of both sizes; `size`: the photo's width and height."""
    requests = photo_requests(portraits, size)
    lines = [
        "| in flight | images/s (full answers) | P50 ms | P99 ms "
        "| preprocess CPU ms per image | failed | degraded |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory(prefix="strata-") as tmp:
        config, run = image_config(config, Path(tmp), objective_ms), Path(tmp) / "run"
        run.mkdir()
        with LoadPool(1) as pool, running(config, run) as (supervisor, _):
            lines += _points(supervisor, pool, requests, seconds)
    return "\n".join(lines)


def _points(
    supervisor: Supervisor, pool: LoadPool, requests: tuple[bytes, ...], seconds: float
) -> list[str]:
    """A table row per concurrency: throughput, P50, P99, preprocess CPU per image, and the
    requests that failed from the step on (their most common error below the table); then
    each process's CPU per answered request at each concurrency."""
    processes = cpu.processes(service_pids(supervisor))
    plan = Plan(
        target=supervisor.address("gateway"),
        method=INFER,
        requests=requests,
        metadata=CLIENT,
        timeout=None,  # as a client library sends by default: no deadline
        connections=1,
    )
    rows, errors = [], Counter[str]()
    by_process: dict[int, dict[str, float]] = {}
    for concurrency in CONCURRENCIES:
        warm = closed(pool, plan, concurrency, WARM_SECONDS)
        before = cpu.snapshot(processes)
        results = closed(pool, plan, concurrency, seconds)
        used = cpu.spent(before, cpu.snapshot(processes))
        answered = max(int(results.ok.sum()), 1)
        by_process[concurrency] = {name: s * 1000 / answered for name, s in used.items()}
        full = results.goodput(math.inf)  # answered by the chain, not from the cache
        preprocess = sum(s for name, s in used.items() if name.startswith("preprocess"))
        per_image = preprocess * 1000 / max(full * seconds, 1)
        failed = warm.error_counts() + results.error_counts()
        errors += failed
        rows.append(
            f"| {concurrency} | {full:.0f} | {results.percentile_ms(50):.1f} "
            f"| {results.percentile_ms(99):.1f} | {per_image:.2f} | {failed.total()} "
            f"| {warm.degraded() + results.degraded()} |"
        )
        print(rows[-1], flush=True)
    if errors:
        message, count = errors.most_common(1)[0]
        rows += ["", f"Most common failure ({count} of {errors.total()}): {message[:300]}"]
    table = cpu_table({"Strata": by_process})
    print("\n".join(table), flush=True)
    return [
        *rows,
        "",
        "CPU ms per answered request, by process (utime + stime, /proc):",
        "",
        *table,
    ]


def _counts(text: str) -> list[int]:
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give counts such as 1,2") from None
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: every count must be 1 or more")
    return counts


def photo_size(text: str) -> tuple[int, int]:
    width, _, height = text.partition("x")
    if not (width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give WIDTHxHEIGHT, e.g. 1280x960")
    return int(width), int(height)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.image_chain", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds a point")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 s a point")
    parser.add_argument(
        "--objective-ms",
        type=float,
        help="the pipeline's latency objective (default: the config's); a long one keeps the "
        "ladder from shedding load, which this machine's other work may otherwise bring on",
    )
    parser.add_argument(
        "--portraits",
        type=int,
        default=0,
        choices=range(11),
        help="of every 10 requests, how many send the photo upright",
    )
    parser.add_argument(
        "--photo-size", type=photo_size, default=PHOTO, help="the photo's WIDTHxHEIGHT (640x480)"
    )
    parser.add_argument(
        "--replicas",
        type=_counts,
        help="compare counts of preprocess replicas instead (e.g. 1,2): the system started "
        "for each, in alternating rounds, at --concurrency (bench/image_replicas.py)",
    )
    parser.add_argument(
        "--threads",
        type=_counts,
        default=[1],
        help="with --replicas: preprocess.threads to compare too (e.g. 1,4)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --replicas: rounds")
    parser.add_argument(
        "--concurrency", type=int, default=16, help="with --replicas: requests in flight"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    seconds = 1.0 if args.quick else args.seconds
    if args.replicas:
        # Imported here: bench.image_replicas builds on this module's config and constants.
        from bench.image_replicas import compare

        variants = [(r, t) for r in args.replicas for t in args.threads]
        requests = photo_requests(args.portraits, args.photo_size)
        timing = (1 if args.quick else args.rounds, seconds, args.concurrency)
        size = "x".join(map(str, args.photo_size))
        title = f"Preprocess replicas, {size} JPEGs"
        table = compare(args.config, variants, requests, timing, args.objective_ms)
        name = "image_replicas.md"
    else:
        title, name = "An image pipeline through the chain", "image_chain.md"
        table = measure(args.config, seconds, args.objective_ms, args.portraits, args.photo_size)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / name).write_text(f"# {title}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
