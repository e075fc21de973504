"""Text steps alone: string normalisation and tokenisation, with their edge cases."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors

from services.preprocess.steps import StepError
from services.preprocess.steps import build_step_options as build
from services.preprocess.steps.text import BYTES_PER_TOKEN

VOCAB = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "world": 5, "the": 6, "cat": 7}


def texts(*items: bytes) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small WordLevel tokenizer.json built offline, BERT-style special tokens."""
    tokenizer = Tokenizer(models.WordLevel(VOCAB, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)],
    )
    folder = tmp_path_factory.mktemp("tok")
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def tokenize(folder: Path, **options) -> object:
    return build("tokenize", {"input": "text", "tokenizer": "tokenizer.json", **options}, folder)


# normalize_text


@pytest.mark.parametrize(
    ("options", "given", "expected"),
    [
        ({}, "  Café \n", "Café"),
        ({"lowercase": True}, " ÀB ", "àb"),
        ({"strip": False}, " a ", " a "),
        # NFC composes e + combining acute; NFKC also folds the "fi" ligature and full-width A.
        ({"unicode": "NFC"}, "e\u0301", "\u00e9"),
        ({"unicode": "NFKC"}, "\ufb01 \uff21", "fi A"),
        ({"unicode": "NFD"}, "\u00e9", "e\u0301"),
        ({"unicode": "none"}, "\ufb01", "\ufb01"),
        ({}, "", ""),
    ],
)
def test_normalize_text(options: dict, given: str, expected: str) -> None:
    step = build("normalize_text", {"input": "t", **options}, Path("."))
    out = step.process({"t": texts(given.encode())})["t"]
    assert out.tolist() == [expected.encode()]


def test_normalize_text_keeps_shape_and_other_tensors() -> None:
    step = build("normalize_text", {"input": "t", "output": "n", "lowercase": True}, Path("."))
    values = texts(b"A", b"B").reshape(2, 1)
    out = step.process({"t": values, "other": np.ones(2)})
    assert out["n"].shape == (2, 1) and out["n"].tolist() == [[b"a"], [b"b"]]
    assert set(out) == {"t", "n", "other"}


def test_normalize_text_empty_batch() -> None:
    step = build("normalize_text", {"input": "t"}, Path("."))
    out = step.process({"t": np.empty(0, dtype=object)})["t"]
    assert out.shape == (0,) and out.dtype == object


def test_normalize_text_refuses_non_utf8_naming_the_element() -> None:
    step = build("normalize_text", {"input": "t"}, Path("."))
    with pytest.raises(StepError, match=r"input 't': element 1 is not valid UTF-8 \(byte 1\)"):
        step.process({"t": texts(b"ok", b"a\xff")})


@pytest.mark.parametrize(
    ("values", "words"),
    [
        (np.zeros(2, np.float32), "needs a BYTES tensor"),
        (texts(b"a", b"b").reshape(1, 2), "[batch] or [batch, 1]"),
    ],
)
def test_normalize_text_refuses_wrong_tensors(values: np.ndarray, words: str) -> None:
    step = build("normalize_text", {"input": "t"}, Path("."))
    with pytest.raises(StepError, match=words.replace("[", r"\[")):
        step.process({"t": values})


def test_normalize_text_refuses_unknown_form() -> None:
    with pytest.raises(ValueError, match=r"normalize_text.unicode\n  Input should be 'NFC'"):
        build("normalize_text", {"input": "t", "unicode": "NFX"}, Path("."))


# tokenize


def test_tokenize_pads_to_the_longest_and_truncates(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=5)
    out = step.process({"text": texts(b"Hello world", b"", b"the cat the cat the cat")})
    assert set(out) == {"input_ids", "attention_mask", "token_type_ids"}
    assert out["input_ids"].tolist() == [[2, 4, 5, 3, 0], [2, 3, 0, 0, 0], [2, 6, 7, 6, 3]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 0], [1, 1, 0, 0, 0], [1] * 5]
    assert all(v.dtype == np.int64 for v in out.values())
    assert out["token_type_ids"].sum() == 0


def test_tokenize_unknown_words_and_pairs(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=8, padding="max_length", pair="question")
    out = step.process({"text": texts(b"hello zebra"), "question": texts(b"cat")})
    assert out["input_ids"].tolist() == [[2, 4, 1, 3, 7, 3, 0, 0]]
    assert out["token_type_ids"].tolist() == [[0, 0, 0, 0, 1, 1, 0, 0]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 1, 0, 0]]


def test_tokenize_empty_batch_has_the_padded_width(tokenizer_dir: Path) -> None:
    fixed = tokenize(tokenizer_dir, max_length=6, padding="max_length")
    assert fixed.process({"text": np.empty(0, dtype=object)})["input_ids"].shape == (0, 6)
    longest = tokenize(tokenizer_dir, max_length=6)
    assert longest.process({"text": np.empty(0, dtype=object)})["input_ids"].shape == (0, 0)


def test_tokenize_without_truncation_refuses_long_texts(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=4, truncation=False)
    assert step.process({"text": texts(b"the cat")})["input_ids"].shape == (1, 4)
    with pytest.raises(StepError, match="element 0 has 6 tokens, more than max_length 4"):
        step.process({"text": texts(b"the cat the cat")})


def test_tokenize_output_names_and_dropping_type_ids(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=4, input_ids="ids", token_type_ids=None)
    out = step.process({"text": texts(b"cat"), "keep": np.ones(1)})
    assert set(out) == {"ids", "attention_mask", "keep"}


def test_tokenize_refuses_non_utf8_and_mismatched_pairs(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=4, pair="q")
    with pytest.raises(StepError, match="input 'q': element 0 is not valid UTF-8"):
        step.process({"text": texts(b"cat"), "q": texts(b"\xc3")})
    with pytest.raises(StepError, match="disagree on the batch size: 1 and 2"):
        step.process({"text": texts(b"cat"), "q": texts(b"a", b"b")})


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"max_length": 0}, r"tokenize.max_length\n  Input should be greater than 0"),
        ({"max_length": 4, "padding": "left"}, "Input should be 'longest' or 'max_length'"),
        ({"max_length": True}, r"tokenize.max_length\n  Input should be a valid integer"),
        (
            {"max_length": 4, "input_ids": None, "attention_mask": None, "token_type_ids": None},
            "every output is switched off",
        ),
        ({"max_length": 4, "tokenizer": "missing.json"}, "not found"),
        ({"max_length": 4, "pad_token": "<pad>"}, "not in the tokenizer's vocabulary"),
    ],
)
def test_tokenize_config_mistakes(tokenizer_dir: Path, options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        tokenize(tokenizer_dir, **options)


def test_tokenize_refuses_a_corrupt_tokenizer_file(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot load tokenizer"):
        tokenize(tmp_path, max_length=4)


def test_tokenize_reads_only_what_max_length_tokens_can_take(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=4)
    limit = 4 * BYTES_PER_TOKEN
    # Cut inside a 2-byte character: the cut backs off to its start, never invalid UTF-8.
    text = b"x" + "é".encode() * limit
    assert step._texts({"text": texts(text)}, "text") == [text[: limit - 1].decode()]
    huge = b"hello world " * (1 << 20)  # 12 MiB: seconds to encode whole
    started = time.perf_counter()
    out = step.process({"text": texts(huge)})
    assert out["input_ids"].tolist() == [[2, 4, 5, 3]]
    assert time.perf_counter() - started < 0.5, "encoding must not read the whole text"


def test_tokenize_without_truncation_refuses_texts_past_the_byte_bound(tokenizer_dir: Path) -> None:
    step = tokenize(tokenizer_dir, max_length=4, truncation=False)
    with pytest.raises(StepError, match=r"element 0 is 257 bytes long, more than max_length 4"):
        step.process({"text": texts(b" " * 256 + b"x")})
