"""The peers on real work: `python -m bench.peers.images [--quick]` (`make bench-peers`).

Two workloads, each served by Strata, by MLServer 1.7.1 with a custom runtime doing the same
steps and model with its adaptive batching (16 rows, 5 ms), with 1 and with 2 parallel
workers, for images by KServe 0.21.0 as a transformer in front of a predictor
(bench/peers/kserve_images.py), and run by the in-process loop (bench/peers/inprocess.py:
the steps and the model in one Python process with no server, then two such processes at
once: the ceiling):

- images: the work of bench.image_chain, one 640x480 JPEG a request as v2 BYTES: decode ->
  resize (shorter side 256, bilinear) -> centre crop 224 -> normalise -> CHW (Pillow and
  numpy in the peers: bench/peers/photo.py, bench/peers/mlserver_images.py), the stand-in
  classifier (bench.image_chain.vision_model), softmax and top 5. Strata: the config's system
  with the `images` pipeline, its latency objective the config's unless `--objective-ms`.
- text: the embed pipeline of `--text-config` (configs/text.yaml), one sentence a request:
  its tokenizer (bench/peers/sentences.py, bench/peers/mlserver_text.py) and MiniLM
  (`make models-text`); skipped, saying why, where the model is not built.

Every model runs on one ONNX Runtime thread. Each server is driven by the project's load
tool, one gRPC connection, closed loop at 1, 16 and 64 in flight (--quick: 1 and 8, 2 s
each), each call with no deadline, as tritonclient and perf_analyzer send by default:
throughput, P50, P99, CPU ms per answered request (its processes and their children) and the
requests that failed, with the commonest failure; then the CPU per answered request
of each process (bench/peers/per_process.py): Strata's gateway, each preprocess replica,
each inference deployment and postprocess beside MLServer's workers and the loop's. Results
go to `--out` as peers_images.md and peers_text.md.
"""

from __future__ import annotations

import argparse
import functools
import json
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench.deployment import free_port, running, service_pids
from bench.image_chain import PIPELINE, image_config, photo_requests, photo_size, vision_model
from bench.load import LoadPool
from bench.peers import venvs
from bench.peers.per_process import cpu_table
from bench.peers.rows import QUICK, Row, Timing
from bench.peers.run import RESULTS, measure
from bench.peers.servers import (
    HERE,
    ROOT,
    Target,
    Unavailable,
    await_ready,
    installed,
    kserve_flags,
    loopback_address,
    port_of,
    server_process,
)
from bench.text import SENTENCES
from strata.config import load_settings
from strata.tools.launch import ROOT as PROJECT
from strata.wire import codec

FULL = Timing((1, 16, 64), 10.0, 2.0)
OBJECTIVE = 10.0  # seconds: goodput is not what this compares
TEXT = "embed"


@dataclass(frozen=True)
class Work:
    """One workload: what a request carries, and how each server and the loop are set up."""

    name: str  # images, text: the results file's suffix
    heading: str
    model: str  # the pipeline's name, and the model's name in MLServer
    requests: tuple[bytes, ...]
    strata: Callable[[Path], AbstractContextManager[Target]]  # given a scratch folder
    runtime: str  # the MLServer implementation
    parameters: dict[str, Any]  # its model-settings parameters
    loop: list[str]  # bench.peers.inprocess's arguments
    kserve: str | None = None  # the KServe transformer + predictor script, where there is one


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out
    timing = QUICK if args.quick else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    with LoadPool(1) as pool:
        for name in args.workloads:
            with tempfile.TemporaryDirectory(prefix="strata-peers-") as tmp:
                try:
                    work = WORKLOADS[name](args, Path(tmp))
                except Unavailable as exc:
                    table = f"# The peers on the {name} workload\n\nSkipped: {exc}"
                else:
                    table = run(work, pool, timing, Path(tmp))
            print(table)
            (args.out / f"peers_{name}.md").write_text(table + "\n")
    return 0


def images(args: argparse.Namespace, folder: Path) -> Work:
    size = "x".join(map(str, args.photo_size))
    vision_model(folder / "vision")
    model = folder / "vision" / "1" / "model.onnx"
    return Work(
        name="images",
        heading=f"The peers on the image workload ({size} JPEGs)",
        model=PIPELINE,
        requests=photo_requests(0, args.photo_size),
        strata=functools.partial(_image_system, args.config, args.objective_ms),
        runtime="mlserver_images.ImageModel",
        parameters={"uri": str(model)},
        loop=["images", "--model", str(model), "--photo-size", size],
        kserve="kserve_images.py",
    )


def text(args: argparse.Namespace, folder: Path) -> Work:
    settings = load_settings(args.text_config)
    step = settings.pipelines[TEXT].preprocess[0]
    model = settings.repository / "minilm" / "1" / "model.onnx"
    tokenizer = settings.repository / step.tokenizer
    if not (model.is_file() and tokenizer.is_file()):
        raise Unavailable(f"no MiniLM at {model} (`make models-text` builds it)")
    requests = tuple(
        codec.build_request(TEXT, {"text": np.array([s], dtype=object)}).SerializeToString()
        for s in SENTENCES
    )
    return Work(
        name="text",
        heading="The peers on the embed pipeline's work (MiniLM, one sentence a request)",
        model=TEXT,
        requests=requests,
        strata=lambda scratch: strata(args.text_config),
        runtime="mlserver_text.TextModel",
        parameters={"uri": str(model), "extra": {"tokenizer": str(tokenizer)}},
        loop=["text", "--model", str(model), "--tokenizer", str(tokenizer)],
    )


WORKLOADS = {"images": images, "text": text}


def _image_system(
    config: Path, objective_ms: float | None, scratch: Path
) -> AbstractContextManager[Target]:
    scratch.mkdir()
    return strata(image_config(config, scratch, objective_ms))


def run(work: Work, pool: LoadPool, timing: Timing, folder: Path) -> str:
    """Every server and the loop on `work`: the table."""
    ceiling = [in_process(work, processes, timing.seconds) for processes in (1, 2)]
    rows, skipped = [], {}
    starts = {"strata": lambda: work.strata(folder / "strata")}
    starts |= {f"mlserver-{n}": functools.partial(mlserver, folder, work, n) for n in (1, 2)}
    if work.kserve:
        starts["kserve"] = functools.partial(kserve, folder, work)
    for name, start in starts.items():
        try:
            with start() as target:
                rows += measure(pool, _with(target, work.requests), timing, OBJECTIVE)
        except Unavailable as exc:
            skipped[name] = str(exc)
            print(f"{name} skipped: {exc}", flush=True)
    return markdown(work.heading, rows, ceiling, skipped)


def _with(target: Target, requests: tuple[bytes, ...]) -> Target:
    return Target(target.server, target.title, target.address, requests, "", target.roots)


@contextmanager
def strata(config: Path) -> Iterator[Target]:
    """The system of `config`, its logs in a temporary folder."""
    with (
        tempfile.TemporaryDirectory(prefix="strata-") as tmp,
        running(config, Path(tmp)) as (
            supervisor,
            _,
        ),
    ):
        pids = functools.partial(service_pids, supervisor)
        address = supervisor.address("gateway")
        yield Target("strata", "Strata pipeline (gateway)", address, (), "", pids)


@contextmanager
def mlserver(folder: Path, work: Work, workers: int) -> Iterator[Target]:
    """MLServer with the workload's runtime, `workers` parallel inference workers."""
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
        "name": work.model,
        "implementation": work.runtime,
        "max_batch_size": 16,
        "max_batch_time": 0.005,
        "parameters": work.parameters,
    }
    (root / work.model).mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps(settings))
    (root / work.model / "model-settings.json").write_text(json.dumps(model_settings))
    log = folder / f"mlserver-{workers}.log"
    # Its own python, not the console script: a copied venv's scripts name the original's.
    command = [str(python), "-c", "from mlserver.cli.main import main; main()", "start", str(root)]
    with server_process(command, log, {"PYTHONPATH": str(HERE)}) as process:
        await_ready(address, work.model, process, log)
        title = f"MLServer 1.7.1, {workers} worker{'s' * (workers > 1)} (batching 16 / 5 ms)"
        roots = {"mlserver": process.pid}
        yield Target(f"mlserver-{workers}", title, address, (), "", roots.copy)


@contextmanager
def kserve(folder: Path, work: Work) -> Iterator[Target]:
    """KServe's model server as a transformer (the steps, softmax and top 5) in front of a
    predictor (the model), over v2 gRPC: two processes."""
    python = installed(venvs.KSERVE)
    script = [str(python), str(HERE / str(work.kserve))]
    predictor, front = loopback_address(), loopback_address()
    env = {"KSERVE_LOGLEVEL": "WARNING", "PYTHONPATH": str(HERE)}
    with ExitStack() as stack:
        roots = {}
        for role, address, extra in (
            ("predictor", predictor, ["--model_path", work.parameters["uri"]]),
            ("transformer", front, ["--predictor_host", predictor]),
        ):
            log = folder / f"kserve-{role}.log"
            command = [*script, role, *extra, *kserve_flags(address)]
            process = stack.enter_context(server_process(command, log, env))
            await_ready(address, work.model, process, log)
            roots[role] = process.pid
        title = "KServe 0.21.0 (transformer + predictor)"
        yield Target("kserve", title, front, (), "", roots.copy)


def in_process(work: Work, processes: int, seconds: float) -> dict[str, float]:
    """`processes` in-process loops at once: requests/s in all, P50 and P99 of the first's,
    CPU ms per request."""
    command = [sys.executable, "-m", "bench.peers.inprocess", *work.loop, "--seconds", str(seconds)]
    loops = [
        subprocess.Popen(command, cwd=PROJECT, stdout=subprocess.PIPE, text=True)
        for _ in range(processes)
    ]
    results = [json.loads(loop.communicate()[0]) for loop in loops]
    latencies = sorted(results[0]["latencies_ms"])
    count = sum(r["requests"] for r in results)
    figures = {
        "processes": processes,
        "per_second": sum(r["requests"] / r["seconds"] for r in results),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "cpu_ms": sum(r["cpu_seconds"] for r in results) * 1000 / max(count, 1),
    }
    print(f"{work.name} in-process x{processes}: {figures}", flush=True)
    return figures


def markdown(
    heading: str, rows: list[Row], ceiling: list[dict[str, float]], skipped: dict[str, str]
) -> str:
    """One table row per server: each concurrency's throughput, CPU and failures."""
    concurrencies = sorted({r.concurrency for r in rows}) or [1]
    head = ["server", "c=1 P50 / P99 ms", *(f"c={c} full answers/s" for c in concurrencies)]
    head += ["CPU ms/request (" + ", ".join(f"c={c}" for c in concurrencies) + ")"]
    head += ["errors", "degraded"]
    lines = [f"# {heading}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    by_server: dict[str, list[Row]] = {}
    for row in rows:
        by_server.setdefault(row.title, []).append(row)
    for title, points in by_server.items():
        first = points[0].point
        cells = [title, f"{first.p50_ms:.1f} / {first.p99_ms:.1f}"]
        cells += [f"{p.full_throughput:.1f}" for p in points]
        cells += [" / ".join(f"{p.cpu_total_ms:.1f}" for p in points)]
        cells += [" / ".join(str(sum(p.point.errors.values())) for p in points)]
        cells += [" / ".join(str(p.point.degraded) for p in points)]
        lines.append("| " + " | ".join(cells) + " |")
    for c in ceiling:  # a loop, not a server: its requests/s stand in the c=1 column
        cells = [_loop_title(c)]
        cells += [f"{c['p50_ms']:.1f} / {c['p99_ms']:.1f}", f"{c['per_second']:.1f}"]
        cells += ["-"] * (len(concurrencies) - 1) + [f"{c['cpu_ms']:.1f}", "0", "0"]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "CPU ms per answered request, by process (utime + stime, /proc):", ""]
    lines += cpu_table(
        {title: {p.concurrency: p.cpu_ms for p in points} for title, points in by_server.items()},
        {_loop_title(c): c["cpu_ms"] for c in ceiling},
    )
    for title, points in by_server.items():
        failures = Counter[str]()
        for p in points:
            failures.update(p.point.messages)
        if failures:
            message, count = failures.most_common(1)[0]
            lines += ["", f"{title}: commonest failure ({count}): {message[:300]}"]
    lines += ["", *(f"Skipped {name}: {why}" for name, why in skipped.items())]
    return "\n".join(lines)


def _loop_title(ceiling: dict[str, float]) -> str:
    n = int(ceiling["processes"])
    return f"in-process loop, {n} process{'es' * (n > 1)} at once (no server)"


def _workloads(text: str) -> list[str]:
    chosen = [w.strip() for w in text.split(",") if w.strip()]
    unknown = sorted(set(chosen) - set(WORKLOADS))
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(f"choose from {','.join(WORKLOADS)}, not {text!r}")
    return chosen


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.peers.images", description=__doc__)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "default.yaml")
    parser.add_argument(
        "--text-config",
        type=Path,
        default=ROOT / "configs" / "text.yaml",
        help="the system whose embed pipeline the text workload measures",
    )
    parser.add_argument(
        "--workloads", type=_workloads, default=list(WORKLOADS), help="images,text (both)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: c=1 and c=8, 2 s each")
    parser.add_argument("--photo-size", type=photo_size, default=(640, 480), help="WIDTHxHEIGHT")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    parser.add_argument(
        "--objective-ms",
        type=float,
        help="Strata's latency objective for the images pipeline (default: the config's); a "
        "long one keeps the ladder from shedding load where the machine's other work slows it",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
