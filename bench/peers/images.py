"""The peers on the image workload: `python -m bench.peers.images [--quick]` (`make bench-peers`).

The work of bench.image_chain, one 640x480 JPEG a request as v2 BYTES: decode -> resize
(shorter side 256, bilinear) -> centre crop 224 -> normalise -> CHW, the stand-in classifier
(bench.image_chain.vision_model, one ONNX Runtime thread), softmax and top 5, served by:

1. Strata, the config's system with the `images` pipeline (bench.image_chain.image_config),
   the pipeline's latency objective the config's unless `--objective-ms` sets one;
2. MLServer 1.7.1 with a custom runtime doing the same steps with Pillow and numpy and the
   same model (bench/peers/mlserver_images.py), its adaptive batching on (16 rows, 5 ms),
   with 1 and with 2 parallel workers;
3. the in-process loop, the ceiling: the steps and the model in one Python process with no
   server (bench/peers/inprocess.py), then two such processes at once.

Each server is driven by the project's load tool, one gRPC connection, closed loop at 1, 16
and 64 in flight (--quick: 1 and 8, 2 s each): throughput, P50, P99, CPU ms per answered
request (its processes and their children) and the requests that failed, with the commonest
failure. Results go to `--out` as peers_images.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.deployment import free_port, running, service_pids
from bench.image_chain import PIPELINE, image_config, photo_requests, photo_size, vision_model
from bench.load import LoadPool
from bench.peers import venvs
from bench.peers.rows import QUICK, Row, Timing
from bench.peers.run import RESULTS, measure
from bench.peers.servers import (
    HERE,
    ROOT,
    Target,
    Unavailable,
    await_ready,
    installed,
    loopback_address,
    port_of,
    server_process,
)
from strata.launch import ROOT as PROJECT

FULL = Timing((1, 16, 64), 10.0, 2.0)
CARRIES = "one JPEG, BYTES [1]"
OBJECTIVE = 10.0  # seconds: goodput is not what this compares


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    timing = QUICK if args.quick else FULL
    size = "x".join(map(str, args.photo_size))
    requests = photo_requests(0, args.photo_size)
    rows, skipped, ceiling = [], {}, []
    with tempfile.TemporaryDirectory(prefix="strata-peers-") as tmp, LoadPool(1) as pool:
        folder = Path(tmp)
        vision_model(folder / "vision")
        model = folder / "vision" / "1" / "model.onnx"
        ceiling = [in_process(model, processes, timing.seconds, size) for processes in (1, 2)]
        for name, start in _servers(args.config, folder, model, args.objective_ms):
            try:
                with start() as target:
                    rows += measure(pool, _with(target, requests), timing, OBJECTIVE)
            except Unavailable as exc:
                skipped[name] = str(exc)
                print(f"{name} skipped: {exc}", flush=True)
    table = markdown(rows, ceiling, skipped, size)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "peers_images.md").write_text(table + "\n")
    return 0


def _servers(
    config: Path, folder: Path, model: Path, objective_ms: float | None
) -> list[tuple[str, object]]:
    return [
        ("strata", lambda: strata(config, folder, objective_ms)),
        *((f"mlserver-{n}", lambda n=n: mlserver(folder, model, n)) for n in (1, 2)),
    ]


def _with(target: Target, requests: tuple[bytes, ...]) -> Target:
    return Target(target.server, target.title, target.address, requests, CARRIES, target.roots)


@contextmanager
def strata(config: Path, folder: Path, objective_ms: float | None) -> Iterator[Target]:
    """The config's system serving the `images` pipeline, its latency objective
    `objective_ms` where given."""
    work = folder / "strata"
    work.mkdir()
    path = image_config(config, work, objective_ms)
    (work / "run").mkdir()
    with running(path, work / "run") as (supervisor, _):
        pids = functools.partial(service_pids, supervisor)
        address = supervisor.address("gateway")
        yield Target("strata", "Strata pipeline (gateway)", address, (), "", pids)


@contextmanager
def mlserver(folder: Path, model: Path, workers: int) -> Iterator[Target]:
    """MLServer with the image runtime, `workers` parallel inference workers."""
    python = installed(venvs.MLSERVER)
    address, http, root = loopback_address(), loopback_address(), folder / f"mlserver-{workers}"
    settings = {
        "debug": False,
        "host": "127.0.0.1",
        "grpc_port": port_of(address),
        "http_port": port_of(http),
        "metrics_port": free_port(),
        "model_repository_root": str(root),
        "load_models_at_startup": True,
        "parallel_workers": workers,
    }
    model_settings = {
        "name": PIPELINE,
        "implementation": "mlserver_images.ImageModel",
        "max_batch_size": 16,
        "max_batch_time": 0.005,
        "parameters": {"uri": str(model)},
    }
    (root / PIPELINE).mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings))
    (root / PIPELINE / "model-settings.json").write_text(json.dumps(model_settings))
    log = folder / f"mlserver-{workers}.log"
    # Its own python, not the console script: a copied venv's scripts name the original's.
    command = [str(python), "-c", "from mlserver.cli.main import main; main()", "start", str(root)]
    with server_process(command, log, {"PYTHONPATH": str(HERE)}) as process:
        await_ready(address, PIPELINE, process, log)
        title = f"MLServer 1.7.1, {workers} worker{'s' * (workers > 1)} (batching 16 / 5 ms)"
        roots = {"mlserver": process.pid}
        yield Target(f"mlserver-{workers}", title, address, (), "", roots.copy)


def in_process(model: Path, processes: int, seconds: float, size: str) -> dict[str, float]:
    """`processes` in-process loops at once: images/s in all, P50 and P99 of the first's
    images, CPU ms per image."""
    command = [sys.executable, "-m", "bench.peers.inprocess", "--model", str(model)]
    command += ["--seconds", str(seconds), "--photo-size", size]
    loops = [
        subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    results = [json.loads(loop.communicate()[0]) for loop in loops]
    latencies = sorted(results[0]["latencies_ms"])
    images = sum(r["images"] for r in results)
    figures = {
        "processes": processes,
        "images_per_second": sum(r["images"] / r["seconds"] for r in results),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "cpu_ms": sum(r["cpu_seconds"] for r in results) * 1000 / max(images, 1),
    }
    print(f"in-process x{processes}: {figures}", flush=True)
    return figures


def markdown(
    rows: list[Row], ceiling: list[dict[str, float]], skipped: dict[str, str], size: str
) -> str:
    """One table row per server: each concurrency's throughput, CPU and failures."""
    concurrencies = sorted({r.concurrency for r in rows}) or [1]
    head = ["server", "c=1 P50 / P99 ms", *(f"c={c} images/s" for c in concurrencies)]
    head += ["CPU ms/image (" + ", ".join(f"c={c}" for c in concurrencies) + ")", "errors"]
    lines = [
        f"# The peers on the image workload ({size} JPEGs)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    by_server: dict[str, list[Row]] = {}
    for row in rows:
        by_server.setdefault(row.title, []).append(row)
    for title, points in by_server.items():
        first = points[0].point
        cells = [title, f"{first.p50_ms:.1f} / {first.p99_ms:.1f}"]
        cells += [f"{p.point.throughput:.1f}" for p in points]
        cells += [" / ".join(f"{p.cpu_total_ms:.1f}" for p in points)]
        cells += [" / ".join(str(sum(p.point.errors.values())) for p in points)]
        lines.append("| " + " | ".join(cells) + " |")
    for c in ceiling:  # a loop, not a server: its images/s stand in the c=1 column
        n = int(c["processes"])
        cells = [f"in-process loop, {n} process{'es' * (n > 1)} at once (no server)"]
        cells += [f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f}", f"{c['images_per_second']:.1f}"]
        cells += ["-"] * (len(concurrencies) - 1) + [f"{c['cpu_ms']:.1f}", "0"]
        lines.append("| " + " | ".join(cells) + " |")
    for title, points in by_server.items():
        failures = Counter[str]()
        for p in points:
            failures.update(p.point.messages)
        if failures:
            message, count = failures.most_common(1)[0]
            lines += ["", f"{title}: commonest failure ({count}): {message[:300]}"]
    lines += ["", *(f"Skipped {name}: {why}" for name, why in skipped.items())]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.images", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument("--quick", action="store_true", help="smoke run: c=1 and c=8, 2 s each")
    parser.add_argument("--photo-size", type=photo_size, default=(640, 480), help="WIDTHxHEIGHT")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument(
        "--objective-ms",
        type=float,
        help="Strata's latency objective for the pipeline (default: the config's); a long one "
        "keeps the ladder from shedding load where the machine's other work slows it",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
