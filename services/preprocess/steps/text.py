"""Text steps: normalise strings, and tokenise them with a `tokenizer.json`.

Both take BYTES tensors of shape [batch] or [batch, 1] whose elements must be UTF-8.
Tokenising reads at most `max_length` * BYTES_PER_TOKEN bytes of each text, so what a text
costs is bounded by the step's maximum length, never by what the client sent.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from tokenizers import Encoding, Tokenizer

from services.preprocess.steps.base import STEPS, resolve
from strata.codec import Arrays, utf8
from strata.config.preprocess import NormalizeTextStep, TokenizeStep
from strata.plugins import StepError, strings

# A generous bound on the UTF-8 bytes one token covers, spaces around it included: subword
# tokens are a few characters, a word no vocabulary splits is one unknown token, and every
# character is at most 4 bytes. Text past max_length tokens' worth is never read.
BYTES_PER_TOKEN = 64


@dataclass
class NormalizeText:
    """Strip, lowercase and Unicode-normalise every string; the shape is kept."""

    input: str
    output: str
    strip: bool = True
    lowercase: bool = False
    unicode: str = "NFC"
    name: str = "normalize_text"

    def process(self, tensors: Arrays) -> Arrays:
        flat = strings(tensors, self.input, self.name)
        out = np.empty(flat.shape[0], dtype=object)
        for index, item in enumerate(flat):
            text = utf8(item, f"input {self.input!r}", index, StepError)
            out[index] = self.normalize(text).encode("utf-8")
        return {**tensors, self.output: out.reshape(tensors[self.input].shape)}

    def normalize(self, text: str) -> str:
        if self.unicode != "none":
            text = unicodedata.normalize(self.unicode, text)  # type: ignore[arg-type]
        if self.lowercase:
            text = text.lower()
        return text.strip() if self.strip else text


@dataclass
class Tokenize:
    """Token ids, attention mask and token type ids (INT64 [batch, length]) for each string.

    Truncation and padding are set once on the tokenizer when the step is built, so requests
    only encode. Each text is first cut to `max_length` * BYTES_PER_TOKEN bytes (at a
    character boundary), so encoding costs what `max_length` allows. Without truncation, a
    text longer than `max_length` tokens, or than that many bytes, is refused.
    """

    input: str
    tokenizer: Tokenizer
    max_length: int
    truncation: bool
    padding: Literal["longest", "max_length"]
    outputs: dict[str, str]
    pair: str | None = None
    add_special_tokens: bool = True
    name: str = "tokenize"

    def process(self, tensors: Arrays) -> Arrays:
        texts = self._texts(tensors, self.input)
        inputs: list[Any] = texts
        if self.pair is not None:
            second = self._texts(tensors, self.pair)
            if len(second) != len(texts):
                raise StepError(
                    f"inputs {self.input!r} and {self.pair!r} disagree on the batch size: "
                    f"{len(texts)} and {len(second)}"
                )
            inputs = list(zip(texts, second, strict=True))
        encodings = self.tokenizer.encode_batch_fast(
            inputs, add_special_tokens=self.add_special_tokens
        )
        if not self.truncation:
            self._check_lengths(encodings)
        length = self.max_length if self.padding == "max_length" else 0
        if encodings:
            length = len(encodings[0].ids)
        rest = {k: v for k, v in tensors.items() if k not in (self.input, self.pair)}
        for attribute, output in self.outputs.items():
            rows = [getattr(encoding, attribute) for encoding in encodings]
            rest[output] = np.array(rows, dtype=np.int64).reshape(len(encodings), length)
        return rest

    def _texts(self, tensors: Arrays, name: str) -> list[str]:
        """Each text of `name`, cut to the bytes `max_length` tokens could take."""
        flat = strings(tensors, name, self.name)
        limit = self.max_length * BYTES_PER_TOKEN
        return [
            utf8(self._cut(item, limit, name, index), f"input {name!r}", index, StepError)
            for index, item in enumerate(flat)
        ]

    def _cut(self, item: object, limit: int, name: str, index: int) -> object:
        """`item`'s first `limit` bytes, ending on a whole UTF-8 character; without
        truncation, a longer item is refused instead."""
        if not isinstance(item, bytes | bytearray) or len(item) <= limit:
            return item
        if not self.truncation:
            raise StepError(
                f"input {name!r}: element {index} is {len(item)} bytes long, more than "
                f"max_length {self.max_length} tokens can take ({limit} bytes)"
            )
        end = limit
        while end > 0 and item[end] & 0xC0 == 0x80:  # a continuation byte: back to its start
            end -= 1
        return bytes(item[:end])

    def _check_lengths(self, encodings: list[Encoding]) -> None:
        for index, encoding in enumerate(encodings):
            tokens = sum(encoding.attention_mask)
            if tokens > self.max_length:
                raise StepError(
                    f"input {self.input!r}: element {index} has {tokens} tokens, "
                    f"more than max_length {self.max_length}"
                )


@STEPS.register("normalize_text")
def _build_normalize_text(spec: NormalizeTextStep, base_dir: Path) -> NormalizeText:
    return NormalizeText(
        input=spec.input,
        output=spec.output or spec.input,
        strip=spec.strip,
        lowercase=spec.lowercase,
        unicode=spec.unicode,
    )


@STEPS.register("tokenize")
def _build_tokenize(spec: TokenizeStep, base_dir: Path) -> Tokenize:
    tokenizer = _load_tokenizer(resolve(base_dir, spec.tokenizer), spec.tokenizer)
    if spec.truncation:
        tokenizer.enable_truncation(spec.max_length)
    else:
        # Encode in full so over-long texts can be refused, not silently cut.
        tokenizer.no_truncation()
    length = spec.max_length if spec.padding == "max_length" else None
    _set_padding(tokenizer, spec.pad_token, length)
    # Encoding attribute -> output tensor, for the outputs not switched off.
    named = {
        "ids": spec.input_ids,
        "attention_mask": spec.attention_mask,
        "type_ids": spec.token_type_ids,
    }
    return Tokenize(
        input=spec.input,
        tokenizer=tokenizer,
        max_length=spec.max_length,
        truncation=spec.truncation,
        padding=spec.padding,
        outputs={attribute: name for attribute, name in named.items() if name is not None},
        pair=spec.pair,
        add_special_tokens=spec.add_special_tokens,
    )


def _load_tokenizer(path: Path, relative: str) -> Tokenizer:
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the library raises a bare Exception for a bad file
        raise ValueError(f"cannot load tokenizer {relative!r}: {exc}") from None


def _set_padding(tokenizer: Tokenizer, pad_token: str | None, length: int | None) -> None:
    """Pad with the file's own pad token unless the config names one."""
    configured = tokenizer.padding or {}
    token = configured.get("pad_token", "[PAD]") if pad_token is None else pad_token
    pad_id = tokenizer.token_to_id(token)
    if pad_id is None:
        raise ValueError(f"pad token {token!r} is not in the tokenizer's vocabulary")
    tokenizer.enable_padding(pad_id=pad_id, pad_token=token, length=length)
