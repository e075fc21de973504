"""The text benchmark: `python -m bench.text --config configs/text.yaml [--quick]`.

MiniLM is the suite's compute-bound case: a request costs far more in the model than in the
hops. For `embed` (fp32) and `embed-int8`:

1. The in-process ceiling: this process tokenises with the pipeline's own tokenizer and runs
   the model with the service's session options, `inference.workers` threads sharing one
   session, at several batch sizes; the best is the ceiling.
2. The chain: the config's text pipelines as real processes on free ports, and closed-loop
   clients keeping `concurrency` requests of `batch` sentences each in flight at the gateway.

Sentences per second for both, and the chain's share of the ceiling, are printed and saved
as text.md and text.json under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import yaml
from tokenizers import Tokenizer

from strata.config import Settings, load_settings
from strata.config.pipelines import Pipeline
from strata.config.preprocess import TokenizeStep
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec

RESULTS = Path(__file__).resolve().parent / "results"
PIPELINES = ("embed", "embed-int8")
# Sentences of everyday lengths (5 to 40 tokens) and several languages, sent in turn.
SENTENCES = [
    "The meeting has been moved to Thursday afternoon.",
    "Can you recommend a good book about the history of mathematics?",
    "Our quarterly revenue grew by twelve percent, driven by strong demand in Asia.",
    "The new phone has a faster chip, a brighter screen and a camera that works in the dark.",
    "Heavy rain is expected across the region tonight, with flooding possible near rivers.",
    "She scored twice in the second half to win the match.",
    "Please restart the server after installing the update.",
    "Der Zug nach Berlin hat heute leider zwanzig Minuten Verspätung.",
    "La réunion de demain est annulée à cause de la grève.",
    "東京の天気は明日から回復する見込みです。",
    "Researchers have found that regular exercise improves sleep quality in older adults.",
    "I lost my keys somewhere between the station and the office.",
    "The committee will publish its final report on the proposed changes to the tax code "
    "early next year, after consulting businesses, unions and the public.",
    "Thanks!",
    "What time does the museum open on Sundays?",
    "Инфляция в стране замедлилась третий месяц подряд.",
]


@dataclass
class Row:
    """One pipeline at one client load."""

    pipeline: str
    batch: int  # sentences per request
    concurrency: int  # requests in flight
    sentences_per_second: float
    p50_ms: float
    p95_ms: float
    degraded: int  # answers the gateway marked cached or degraded (should be none)
    ceiling: float  # in-process sentences per second, best batch size
    ceiling_batch: int

    @property
    def share(self) -> float:
        return self.sentences_per_second / self.ceiling if self.ceiling else 0.0


@dataclass(frozen=True)
class Plan:
    seconds: float  # per measurement
    ceiling_batches: tuple[int, ...]
    loads: tuple[tuple[int, int], ...]  # (sentences per request, requests in flight)


FULL = Plan(5.0, (1, 8, 32), ((1, 1), (1, 16), (16, 4)))
QUICK = Plan(0.5, (1, 8), ((1, 8), (8, 2)))


def sentences(start: int, count: int) -> list[str]:
    return [SENTENCES[(start + i) % len(SENTENCES)] for i in range(count)]


def tokenizer_of(settings: Settings, pipeline: Pipeline) -> tuple[Tokenizer, list[str]]:
    """The pipeline's tokenize step, as the preprocess service configures it."""
    (step,) = [s for s in pipeline.preprocess if isinstance(s, TokenizeStep)]
    tokenizer = Tokenizer.from_file(str(settings.repository / step.tokenizer))
    tokenizer.enable_truncation(step.max_length)
    tokenizer.enable_padding(pad_token=(tokenizer.padding or {}).get("pad_token", "[PAD]"))
    return tokenizer, ["input_ids", "attention_mask", "token_type_ids"]


def session_of(settings: Settings, model: str) -> ort.InferenceSession:
    """The latest version of `model`, with the deployment's session options."""
    folder = settings.repository / model
    version = max(int(p.name) for p in folder.iterdir() if p.name.isdigit())
    manifest = yaml.safe_load((folder / "model.yaml").read_text()) or {}
    config = {**settings.inference.session.model_dump(), **manifest.get("session", {})}
    options = ort.SessionOptions()
    options.intra_op_num_threads = config["intra_op_threads"]
    options.inter_op_num_threads = config["inter_op_threads"]
    available = ort.get_available_providers()
    providers = [p for p in config["execution_providers"] if p in available]
    path = folder / str(version) / "model.onnx"
    return ort.InferenceSession(str(path), options, providers=providers or None)


def ceiling(settings: Settings, name: str, batch: int, threads: int, seconds: float) -> float:
    """Sentences per second tokenised and embedded in this process, `threads` at once."""
    pipeline = settings.pipelines[name]
    tokenizer, inputs = tokenizer_of(settings, pipeline)
    session = session_of(settings, pipeline.model.name)
    names = {i.name for i in session.get_inputs()}
    counts = [0] * threads
    end = time.perf_counter() + seconds

    def loop(index: int) -> None:
        start = index * batch
        while time.perf_counter() < end:
            encodings = tokenizer.encode_batch(sentences(start, batch))
            feed = {
                n: np.array([getattr(e, _FIELDS[n]) for e in encodings], dtype=np.int64)
                for n in inputs
                if n in names
            }
            session.run(None, feed)
            counts[index] += batch
            start += batch

    began = time.perf_counter()
    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return sum(counts) / (time.perf_counter() - began)


_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


@dataclass
class Load:
    """What the clients of one chain measurement saw."""

    sentences_per_second: float
    p50_ms: float
    p95_ms: float
    degraded: int


async def chain(address: str, pipeline: str, batch: int, concurrency: int, seconds: float) -> Load:
    """Closed loop: `concurrency` requests of `batch` sentences always in flight."""
    async with grpc.aio.insecure_channel(address) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        latencies: list[float] = []
        degraded = 0
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds

        async def client(index: int) -> None:
            start = index * batch
            while loop.time() < end:
                texts = np.array([s.encode() for s in sentences(start, batch)], dtype=object)
                request = codec.build_request(pipeline, {"text": texts})
                sent = loop.time()
                reply = await stub.ModelInfer(request, timeout=60)
                latencies.append(loop.time() - sent)
                start += batch * concurrency
                flags = reply.parameters
                if flags["strata.degraded"].bool_param or flags["strata.cached"].bool_param:
                    nonlocal degraded
                    degraded += 1

        began = loop.time()
        await asyncio.gather(*(client(i) for i in range(concurrency)))
        elapsed = loop.time() - began
    p50, p95 = np.percentile(latencies, [50, 95]) * 1e3
    return Load(len(latencies) * batch / elapsed, float(p50), float(p95), degraded)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def deployment(config: Path, pipelines: Sequence[str], scratch: Path) -> Iterator[Supervisor]:
    """The config's `pipelines` alone, every service on a free loopback port."""
    settings = load_settings(config)
    raw = yaml.safe_load(config.read_text())
    raw["pipelines"] = {name: raw["pipelines"][name] for name in pipelines}
    raw["inference"]["models"] = sorted({p["model"]["name"] for p in raw["pipelines"].values()})
    raw["repository"] = str(settings.repository)
    # Measure the model, not the shortcuts: no degradation ladder, no result cache.
    gateway = raw.setdefault("gateway", {})
    gateway["ladder"] = {**gateway.get("ladder", {}), "max_level": 0}
    gateway["cache"] = {**gateway.get("cache", {}), "max_entries": 0}
    raw["services"] = {
        "gateway": {"listen": f"127.0.0.1:{free_port()}"},
        "preprocess": {"listen": f"127.0.0.1:{free_port()}"},
        "postprocess": {"listen": f"127.0.0.1:{free_port()}"},
        "inference": {"a": {"listen": f"127.0.0.1:{free_port()}"}},
    }
    path = scratch / "bench-text.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    supervisor = Supervisor(path, load_settings(path), log_dir=scratch)
    supervisor.start_all(timeout=120)
    try:
        yield supervisor
    finally:
        supervisor.stop_all()


def run(config: Path, plan: Plan, pipelines: Sequence[str] = PIPELINES) -> list[Row]:
    """Ceilings first (nothing else running), then the chain, for every pipeline."""
    settings = load_settings(config)
    threads = settings.inference.workers
    best: dict[str, tuple[float, int]] = {}
    for name in pipelines:
        rates = {b: ceiling(settings, name, b, threads, plan.seconds) for b in plan.ceiling_batches}
        top = max(rates, key=rates.__getitem__)
        best[name] = (rates[top], top)
        print(f"{name}: in-process {', '.join(f'batch {b} {r:.0f}/s' for b, r in rates.items())}")
    rows = []
    with (
        tempfile.TemporaryDirectory(prefix="strata-bench-text-") as scratch,
        deployment(config, pipelines, Path(scratch)) as system,
    ):
        address = system.address("gateway")
        for name in pipelines:
            for batch, concurrency in plan.loads:
                load = asyncio.run(chain(address, name, batch, concurrency, plan.seconds))
                measured = (load.sentences_per_second, load.p50_ms, load.p95_ms, load.degraded)
                rows.append(Row(name, batch, concurrency, *measured, *best[name]))
                print(f"{name}: batch {batch} x {concurrency}: {load.sentences_per_second:.0f}/s")
    return rows


def table(rows: Sequence[Row]) -> str:
    lines = [
        "| pipeline | sentences/request | in flight | sentences/s | P50 ms | P95 ms "
        "| in-process ceiling/s (batch) | of ceiling | degraded |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.pipeline} | {r.batch} | {r.concurrency} | {r.sentences_per_second:.0f} | "
            f"{r.p50_ms:.1f} | {r.p95_ms:.1f} | {r.ceiling:.0f} ({r.ceiling_batch}) | "
            f"{r.share:.0%} | {r.degraded} |"
        )
    return "\n".join(lines)


def write(out: Path, rows: Sequence[Row]) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    markdown, data = out / "text.md", out / "text.json"
    markdown.write_text(f"# Text benchmark\n\n{table(rows)}\n")
    data.write_text(json.dumps([asdict(r) | {"share": r.share} for r in rows], indent=2) + "\n")
    return [markdown, data]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.text", description=__doc__)
    parser.add_argument("--config", type=Path, default=Path("configs/text.yaml"))
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where results go")
    args = parser.parse_args(argv)
    rows = run(args.config, QUICK if args.quick else FULL)
    print(table(rows))
    for path in write(args.out, rows):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
