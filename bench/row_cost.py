"""Inference's CPU per row by batch size: `python -m bench.row_cost [--quick]`.

Two models: MiniLM (`make models-text`; left out, saying so, where it is not built) on the 16
sentences of bench/text.py (4 to 43 tokens), and the stand-in image classifier
(bench.image_chain.vision_model) on 224x224 images. At each batch size N:

- **in process**, the model alone, with the deployment's session options: a batch of N
  consecutive sentences padded to their longest, as preprocess pads a flight, run as one
  session call (`one call`) and as the inference service runs it (`served`: the version's
  own `run_requests`, in buckets of like length, services/inference/buckets.py); batch 1 is
  one sentence at a time, unpadded. The calling thread's CPU time.
- **through the service**: the inference service as its own process, with the deployment's
  workers and batching, sent one request of N rows at a time (`flight`: what the gateway
  sends for a flight of N), and N one-row requests kept in flight (`N in flight`: a closed
  loop whose requests the batcher groups); the process's CPU seconds (/proc) per row
  answered, and, N in flight, the rows its batches held and how busy its worker slots were
  (the batches' run time over the wall time of `inference.workers` slots; v2 statistics).

For a flight, `flight loop` is the part of `flight` its main thread spent: the event loop,
where gRPC's Python side, the request's decoding, the queue and the reply run, while the
session calls run in worker threads; it says whether the service's rows cost more in the
model run or around it. Each size is measured every way back to back, in `--rounds` rounds,
and each figure is the median of its rounds: the machine's speed drifting between one way
and another cannot pass for a difference between them. The fitted bucket costs of the two
copies of MiniLM (docs/inference.md) are printed under the table: the one per-process choice
that sets what a padded batch costs.

CPU milliseconds per row, printed and written to `--out` as row_cost.md with the load
average. CPU time is disturbed by other work less than wall time, but a loaded machine still
inflates it: compare figures only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import yaml
from tokenizers import Tokenizer

from bench.image_chain import MODEL as VISION
from bench.image_chain import image_config
from bench.openloop import ServiceProcess
from bench.peers.cpu import cpu_seconds, thread_seconds
from bench.text import SENTENCES
from services.inference.buckets import Costs
from services.inference.manifest import read_spec
from services.inference.model import load_version, open_session
from strata.config import load_settings
from strata.config.inference import InferenceSettings
from strata.models import repository
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from strata.wire.codec import Arrays

RESULTS = Path(__file__).resolve().parent / "results"
TEXT = "minilm"
SIZES = (1, 2, 4, 8, 16, 32, 64)
ROWS = 96  # rows measured at each batch size and way
COLUMNS = ("one call", "served", "flight", "flight loop", "N in flight")
SHARES = {"rows a batch": ".1f", "workers busy": ".2f"}  # N in flight
ROUNDS = 3
SERVICE_LOG = "inference.log"
Calls = Callable[[v2_grpc.GRPCInferenceServiceStub], Awaitable[None]]


@dataclass
class Line:
    """One model at one batch size: CPU ms per row each way, and rows per batch in flight;
    one figure a round each (`add`), the median read."""

    model: str
    size: int
    rounds: dict[str, list[float]] = field(default_factory=dict)

    def add(self, figures: dict[str, float]) -> None:
        for name, value in figures.items():
            self.rounds.setdefault(name, []).append(value)

    def get(self, name: str) -> float:
        return statistics.median(self.rounds[name]) if name in self.rounds else math.nan


@dataclass(frozen=True)
class Work:
    """A model's inputs: `batch(start, n)` is n rows from the `start`th, padded alike."""

    model: str
    max_rows: int
    batch: Callable[[int, int], Arrays]


def text_work(folder: Path) -> Work:
    """Sentences by the model's own tokenizer, padded with 0 (its [PAD]) to the longest."""
    tokenizer = Tokenizer.from_file(str(folder / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    encoded = [tokenizer.encode(s).ids for s in SENTENCES]

    def batch(start: int, n: int) -> Arrays:
        rows = [encoded[(start + i) % len(encoded)] for i in range(n)]
        ids = np.zeros((n, max(map(len, rows))), np.int64)
        mask = np.zeros_like(ids)
        for i, row in enumerate(rows):
            ids[i, : len(row)], mask[i, : len(row)] = row, 1
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}

    return Work(TEXT, 64, batch)


def image_work() -> Work:
    """Random 3x224x224 images, one per row (the classifier's cost does not hang on them)."""
    images = np.random.default_rng(5).normal(size=(8, 3, 224, 224)).astype(np.float32)

    def batch(start: int, n: int) -> Arrays:
        return {"image": images[[(start + i) % len(images) for i in range(n)]]}

    return Work(VISION, 16, batch)


def sizes_of(work: Work, sizes: tuple[int, ...]) -> list[int]:
    return [n for n in sizes if n <= work.max_rows]


@dataclass(frozen=True)
class InProcess:
    """The model alone in this process, with the deployment's session options, two ways."""

    ways: dict[str, Callable[[Arrays], object]]
    costs: Costs | None  # the fitted bucket costs of its served copy


def in_process(settings: InferenceSettings, folder: Path, work: Work) -> InProcess:
    """One session call a batch, and the service's own run (buckets.py)."""
    spec = read_spec(folder / "model.yaml", settings)
    model = load_version(folder / "1", work.model, 1, spec, ThreadPoolExecutor(1), "bench")
    session = open_session(folder / "1" / "model.onnx", spec.session)
    ways: dict[str, Callable[[Arrays], object]] = {
        "one call": lambda batch: session.run(None, batch),
        "served": lambda batch: model.run_requests([batch]),
    }
    return InProcess(ways, model.bucket_costs)


def run_in_process(alone: InProcess, work: Work, line: Line, rows: int) -> None:
    """One round of the line's batch size, each way: the calling thread's CPU per row."""
    n = line.size
    batches = [work.batch(i * n, n) for i in range(max(2, rows // n))]
    for way, run in alone.ways.items():
        run(batches[0])
        start = time.thread_time()
        for batch in batches:
            run(batch)
        line.add({way: (time.thread_time() - start) * 1e3 / (len(batches) * n)})


async def through_service(
    service: ServiceProcess,
    stub: v2_grpc.GRPCInferenceServiceStub,
    workers: int,
    work: Work,
    line: Line,
    rows: int,
) -> None:
    """One round of the service's CPU per row at the line's batch size, both ways."""
    n = line.size
    requests = [
        codec.build_request(work.model, work.batch(i * n, n)) for i in range(max(2, rows // n))
    ]
    singles = [codec.build_request(work.model, work.batch(i, 1)) for i in range(rows)]
    await stub.ModelInfer(requests[0])
    flights = await _spent(service, stub, work.model, _one_by_one(requests))
    loop = await _spent(service, stub, work.model, _kept_in_flight(singles, n))
    line.add(
        {
            "flight": flights.ms,
            "flight loop": flights.loop_ms,
            "N in flight": loop.ms,
            "rows a batch": loop.rows / loop.batches,
            "workers busy": loop.compute / (loop.wall * workers),
        }
    )


async def measure(
    service: ServiceProcess,
    settings: InferenceSettings,
    alone: InProcess,
    work: Work,
    sizes: list[int],
    rounds: int,
    rows: int,
) -> list[Line]:
    """Every size every way, back to back, `rounds` times over."""
    lines = [Line(work.model, n) for n in sizes]
    async with grpc.aio.insecure_channel(service.address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        for _ in range(rounds):
            for line in lines:
                run_in_process(alone, work, line, rows)
                await through_service(service, stub, settings.workers, work, line, rows)
    return lines


@dataclass(frozen=True)
class Spent:
    """What the service did for some calls."""

    ms: float  # CPU milliseconds per row
    loop_ms: float  # of which the main thread's: the event loop
    rows: int
    batches: int
    compute: float  # seconds its batches ran, summed
    wall: float  # seconds from the first call to the last answer


async def _spent(
    service: ServiceProcess, stub: v2_grpc.GRPCInferenceServiceStub, model: str, calls: Calls
) -> Spent:
    before = await _counts(stub, model)
    cpu, start = _cpu(service.pid), time.monotonic()
    await calls(stub)
    wall, spent = time.monotonic() - start, _cpu(service.pid)
    after = await _counts(stub, model)
    rows, batches, compute = (a - b for a, b in zip(after, before, strict=True))
    process, loop = ((b - a) * 1e3 / rows for a, b in zip(cpu, spent, strict=True))
    return Spent(process, loop, int(rows), int(batches), compute, wall)


def _cpu(pid: int) -> tuple[float, float]:
    """The process's CPU seconds so far, and its main thread's."""
    process, main = cpu_seconds(pid), thread_seconds(pid, pid)
    assert process is not None and main is not None, "the inference service has exited"
    return process, main


def _one_by_one(requests: list[v2.ModelInferRequest]) -> Calls:
    async def calls(stub: v2_grpc.GRPCInferenceServiceStub) -> None:
        for request in requests:
            await stub.ModelInfer(request)

    return calls


def _kept_in_flight(requests: list[v2.ModelInferRequest], n: int) -> Calls:
    """Every request sent, `n` in flight at a time (each client sends its next on an answer)."""

    async def calls(stub: v2_grpc.GRPCInferenceServiceStub) -> None:
        queue = iter(requests)

        async def client() -> None:
            for request in queue:
                await stub.ModelInfer(request)

        await asyncio.gather(*(client() for _ in range(n)))

    return calls


async def _counts(stub: v2_grpc.GRPCInferenceServiceStub, model: str) -> tuple[float, float, float]:
    """Rows answered, batches run and their run time in seconds, so far."""
    reply = await stub.ModelStatistics(v2.ModelStatisticsRequest(name=model))
    stats = reply.model_stats
    return (
        sum(s.inference_count for s in stats),
        sum(s.execution_count for s in stats),
        # Per batch: the request statistics count a batch's run once for each request.
        sum(b.compute_infer.ns for s in stats for b in s.batch_stats) / 1e9,
    )


@contextmanager
def deployment(
    config: Path, scratch: Path, models: list[str]
) -> Iterator[tuple[ServiceProcess, InferenceSettings]]:
    """One inference process loading `models` from a repository beside the stand-in
    classifier (bench.image_chain's), with the config's workers, session and batching. The
    config's first pipeline stays (a config needs one) and its model loads too; the images
    pipeline goes, so that the classifier runs as it is, not with preprocess's normalise
    steps folded in front (it takes what the in-process loop gives it)."""
    raw = yaml.safe_load(image_config(config, scratch).read_text())
    name, first = next(iter(raw["pipelines"].items()))
    raw["pipelines"] = {name: first}
    raw.setdefault("inference", {})["models"] = sorted({*models, first["model"]["name"]})
    for endpoint in raw["services"]["inference"].values():
        endpoint.pop("metrics", None)
    raw.setdefault("telemetry", {})["log_level"] = "INFO"  # the fitted bucket costs' line
    path = scratch / "row_cost.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    with ServiceProcess(path, scratch / SERVICE_LOG) as service:
        yield service, load_settings(path).inference


def table(lines: list[Line]) -> str:
    head = "| model | N | " + " | ".join((*COLUMNS, *SHARES)) + " |"
    rows = [head, "|---|---:|" + "---:|" * (len(COLUMNS) + len(SHARES))]
    for line in lines:
        cells = [f"{line.get(c):.2f}" for c in COLUMNS]
        cells += [f"{line.get(c):{form}}" for c, form in SHARES.items()]
        rows.append(f"| {line.model} | {line.size} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def service_costs(log: Path, model: str) -> str:
    """The bucket costs the service logged for `model` at load (its JSON log lines)."""
    start = f"model {model} version 1 runs in buckets: "
    for line in log.read_text().splitlines():
        message = json.loads(line).get("msg", "") if line.startswith("{") else ""
        if message.startswith(start):
            return message.removeprefix(start)
    return "not logged (runs whole)"


def main(argv: list[str] | None = None) -> None:
    """Measure every batch size every way for each model, and write the table."""
    args = _parser().parse_args(argv)
    sizes = (1, 4) if args.quick else SIZES
    rows, rounds = (8, 1) if args.quick else (args.rows, args.rounds)
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="strata-rowcost-") as folder:
        scratch = Path(folder)
        built = load_settings(args.config).repository / TEXT
        works = [image_work()]
        if (built / "1" / "model.onnx").is_file():
            works.insert(0, text_work(built))
        else:
            print(f"MiniLM is not built ({built}): run `make models-text`; images only")
        lines: list[Line] = []
        notes = []
        with deployment(args.config, scratch, [w.model for w in works]) as (service, settings):
            for work in works:
                folder_of = scratch / "repository" / repository.check_name(work.model)
                alone = in_process(settings, folder_of, work)
                lines += asyncio.run(
                    measure(service, settings, alone, work, sizes_of(work, sizes), rounds, rows)
                )
                if alone.costs is not None:
                    there = service_costs(scratch / SERVICE_LOG, work.model)
                    notes.append(f"{work.model} buckets: in process {alone.costs}; service {there}")
    text = (
        f"Inference's CPU ms per row, the median of {rounds} rounds (load average "
        f"{load[0]:.1f} before, {os.getloadavg()[0]:.1f} after; flight loop: the service's "
        f"event loop's share of flight; rows a batch and workers busy: N in flight)"
        f"\n\n{table(lines)}\n\n" + "".join(f"{note}\n" for note in notes)
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "row_cost.md").write_text(text)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("configs/text.yaml"))
    parser.add_argument("--rows", type=int, default=ROWS, help="rows at each size and way")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="rounds, each way each size")
    parser.add_argument("--quick", action="store_true", help="batch 1 and 4, 8 rows: a smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    return parser


if __name__ == "__main__":
    main()
