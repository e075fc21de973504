"""Sentence-transformers models, loaded offline, with their pooling inside the ONNX graph.

The exported graph takes the tokenizer's tensors and returns the sentence embedding: the
transformer, then the model's own sentence-transformers modules (mean pooling with the
attention mask, L2 normalisation) traced into the same graph. Pooling lives in the graph, not
in a postprocess rule, because the gateway hands postprocess the model's outputs only: the
attention mask never reaches it. With `topics`, a zero-shot classifier head follows: label
descriptions are embedded once, here, and the graph returns softmax(cosine / temperature)
over them.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from tokenizers import Tokenizer

from strata.convert.source import ConversionError, Source, TensorDecl
from strata.wire.codec import Arrays

TOKENIZER_FILE = "tokenizer.json"
# Hugging Face model types whose graphs ONNX Runtime's "bert" optimiser fuses.
BERT_LIKE = {"bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra", "camembert"}
_ENCODING = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}

LONG_TEXT = " ".join(["The committee met again on Tuesday to review the proposal in detail."] * 40)
# The first four batches become the validation cases: short, mixed lengths, truncated, and
# non-English; the rest only widen the parity check.
SAMPLE_BATCHES: list[list[str]] = [
    ["A short sentence."],
    [
        "The cat sat on the mat.",
        "Quarterly revenue grew by twelve percent, beating forecasts.",
        "hi",
        "Researchers found a new species of deep-sea fish near the trench.",
    ],
    [LONG_TEXT],
    [
        "Der schnelle braune Fuchs springt über den faulen Hund.",
        "東京は日本の首都です。",
        "Привет, как дела?",
        "¿Dónde está la biblioteca? 📚",
    ],
]


@dataclass(frozen=True)
class Topics:
    """A zero-shot topic head: label names, their descriptions, the softmax temperature."""

    labels: list[str]
    descriptions: list[str]
    temperature: float


def read_topics(path: Path) -> Topics:
    """`labels: [{name, description}, ...]` and `temperature` from a YAML file."""
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConversionError(f"cannot read topics file {path}: {exc}") from None
    entries = raw.get("labels") if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ConversionError(f"{path}: 'labels' must be a non-empty list of {{name, description}}")
    if not all(isinstance(e, dict) and e.get("name") and e.get("description") for e in entries):
        raise ConversionError(f"{path}: every label needs a 'name' and a 'description'")
    temperature = raw.get("temperature", 0.05)
    if not isinstance(temperature, int | float) or temperature <= 0:
        raise ConversionError(f"{path}: temperature must be a positive number")
    names = [str(e["name"]) for e in entries]
    if len(set(names)) != len(names):
        raise ConversionError(f"{path}: label names repeat")
    return Topics(names, [str(e["description"]) for e in entries], float(temperature))


class SentenceEncoder(torch.nn.Module):
    """Tokenizer tensors -> the transformer -> the model's pooling (and normalising) modules."""

    def __init__(self, model: Any, input_names: Sequence[str]) -> None:
        super().__init__()
        self.transformer = model[0].auto_model
        # Eager attention exports as MatMul/Softmax, which the optimiser fuses into Attention
        # nodes; the SDPA kernel's export matches none of its patterns.
        self.transformer.set_attn_implementation("eager")
        self.poolers = torch.nn.ModuleList(list(model)[1:])
        self.input_names = list(input_names)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        named = dict(zip(self.input_names, inputs, strict=True))
        hidden = self.transformer(**named, return_dict=True).last_hidden_state
        features = {"token_embeddings": hidden, "attention_mask": named["attention_mask"]}
        for module in self.poolers:
            features = module(features)
        return features["sentence_embedding"]


class TopicClassifier(torch.nn.Module):
    """An encoder followed by softmax(cosine(embedding, label embeddings) / temperature)."""

    def __init__(self, encoder: SentenceEncoder, labels: torch.Tensor, temperature: float) -> None:
        super().__init__()
        self.encoder = encoder
        self.register_buffer("labels", torch.nn.functional.normalize(labels, dim=-1))
        self.scale = 1.0 / temperature

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        embedding = torch.nn.functional.normalize(self.encoder(*inputs), dim=-1)
        return torch.softmax(embedding @ self.labels.T * self.scale, dim=-1)


def load_model(folder: Path) -> Any:
    """A SentenceTransformer from a local folder, on the CPU, without any network."""
    # Set before the Hugging Face libraries are first imported, which is when they read them.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from sentence_transformers import SentenceTransformer

    if not (folder / "modules.json").is_file():
        raise ConversionError(f"{folder} is not a sentence-transformers model (no modules.json)")
    return SentenceTransformer(str(folder), device="cpu", local_files_only=True)


def tokenizer_for(folder: Path, max_length: int) -> Tokenizer:
    """The fast tokenizer, truncating and padding as the serving tokenize step does."""
    path = folder / TOKENIZER_FILE
    if not path.is_file():
        raise ConversionError(f"{folder} has no {TOKENIZER_FILE}; serving needs a fast tokenizer")
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.enable_truncation(max_length)
    pad_token = (tokenizer.padding or {}).get("pad_token", "[PAD]")
    pad_id = tokenizer.token_to_id(pad_token)
    if pad_id is None:
        raise ConversionError(f"pad token {pad_token!r} is not in the tokenizer's vocabulary")
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def encode(tokenizer: Tokenizer, texts: Sequence[str], names: Sequence[str]) -> Arrays:
    """INT64 [batch, longest] tensors for `texts`, as the tokenize step makes them."""
    encodings = tokenizer.encode_batch(list(texts))
    return {
        name: np.array([getattr(e, _ENCODING[name]) for e in encodings], dtype=np.int64)
        for name in names
    }


def sentence_source(
    folder: Path,
    topics: Topics | None = None,
    texts: Sequence[str] = (),
    max_length: int | None = None,
) -> Source:
    """A Source for the model in `folder`: the embedding, or with `topics` the probabilities."""
    model = load_model(folder)
    max_length = max_length or model.max_seq_length
    names = [n for n in model.tokenizer.model_input_names if n in _ENCODING]
    if "attention_mask" not in names:
        raise ConversionError(f"{folder}: the tokenizer gives no attention mask to pool with")
    tokenizer = tokenizer_for(folder, max_length)
    encoder = SentenceEncoder(model, names)
    batches = _batches(texts)
    samples = [encode(tokenizer, batch, names) for batch in batches]
    config = encoder.transformer.config
    padding = tokenizer.padding
    assert padding is not None  # tokenizer_for enables it
    pad_id = float(padding["pad_id"])
    source = Source(
        module=encoder,
        inputs=[TensorDecl(n, "int64", ("batch", "sequence")) for n in names],
        outputs=[TensorDecl("embedding", "float32", ("batch", int(config.hidden_size)))],
        samples=samples,
        description=f"sentence-transformers model in {folder}",
        model_type="bert" if config.model_type in BERT_LIKE else None,
        num_heads=int(getattr(config, "num_attention_heads", 0)),
        hidden_size=int(config.hidden_size),
        padding={n: pad_id if n == "input_ids" else 0.0 for n in names},
        files={TOKENIZER_FILE: folder / TOKENIZER_FILE},
        facts={"max_length": max_length, "modules": [type(m).__name__ for m in model]},
    )
    return _with_topics(source, tokenizer, topics) if topics else source


def _batches(texts: Sequence[str]) -> list[list[str]]:
    """The case batches, every text alone, and the user's texts together."""
    alone = [[text] for batch in SAMPLE_BATCHES for text in batch] + [[t] for t in texts]
    together = [list(texts)] if len(texts) > 1 else []
    return [*SAMPLE_BATCHES, *alone, *together]


def _with_topics(source: Source, tokenizer: Tokenizer, topics: Topics) -> Source:
    names = [d.name for d in source.inputs]
    described = encode(tokenizer, topics.descriptions, names)
    with torch.inference_mode():
        labels = source.module(*(torch.from_numpy(described[n]) for n in names))
    head = TopicClassifier(source.module, labels.clone(), topics.temperature)
    source.module = head
    source.outputs = [TensorDecl("probabilities", "float32", ("batch", len(topics.labels)))]
    source.description += f" + topic head ({len(topics.labels)} labels)"
    source.manifest = {**source.manifest, "labels": topics.labels}
    source.facts = {**source.facts, "temperature": topics.temperature, "topics": topics.labels}
    return source
