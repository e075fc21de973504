"""Text steps: normalise strings, and tokenise them with a `tokenizer.json`.

Both take BYTES tensors of shape [batch] or [batch, 1] whose elements must be UTF-8.
Tokenising reads at most `max_length` * BYTES_PER_TOKEN bytes of each text, so what a text
costs is bounded by the step's maximum length, never by what the client sent.
"""

from __future__ import annotations

import unicodedata
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from services.preprocess.steps.base import STEPS, resolve
from strata.config.preprocess import NormalizeTextStep, TokenizeStep
from strata.plugins import StepError, strings
from strata.wire.codec import Arrays, utf8

if TYPE_CHECKING:
    from tokenizers import Encoding, Tokenizer

# A generous bound on the UTF-8 bytes one token covers, spaces around it included: subword
# tokens are a few characters, a word no vocabulary splits is one unknown token, and every
# character is at most 4 bytes. Text past max_length tokens' worth is never read.
BYTES_PER_TOKEN = 64


@STEPS.register("normalize_text")
@dataclass
class NormalizeText:
    """Strip, lowercase and Unicode-normalise every string; the shape is kept."""

    options: NormalizeTextStep

    def process(self, tensors: Arrays) -> Arrays:
        options = self.options
        flat = strings(tensors, options.input, options.kind)
        # Read once, not per string: an option of the spec costs more to read than a local.
        form = None if options.unicode == "none" else options.unicode
        lowercase, strip = options.lowercase, options.strip
        out = np.empty(flat.shape[0], dtype=object)
        for index, item in enumerate(flat):
            text = utf8(item, f"input {options.input!r}", index, StepError)
            if form is not None:
                text = unicodedata.normalize(form, text)
            if lowercase:
                text = text.lower()
            out[index] = (text.strip() if strip else text).encode("utf-8")
        return {**tensors, options.target: out.reshape(tensors[options.input].shape)}


@STEPS.register("tokenize", repository=True)
@dataclass
class Tokenize:
    """Token ids, attention mask and token type ids (INT64 [batch, length]) for each string.

    Truncation and padding are set once on the tokenizer when the step is built, so requests
    only encode. Each text is first cut to `max_length` * BYTES_PER_TOKEN bytes (at a
    character boundary), so encoding costs what `max_length` allows. Without truncation, a
    text longer than `max_length` tokens, or than that many bytes, is refused.
    """

    options: TokenizeStep
    repository: InitVar[Path]
    tokenizer: Tokenizer = field(init=False, repr=False)
    # Encoding attribute -> output tensor, for the outputs not switched off.
    _columns: dict[str, str] = field(init=False)

    def __post_init__(self, repository: Path) -> None:
        options = self.options
        self.tokenizer = _load_tokenizer(resolve(repository, options.tokenizer), options.tokenizer)
        if options.truncation:
            self.tokenizer.enable_truncation(options.max_length)
        else:
            # Encode in full so over-long texts can be refused, not silently cut.
            self.tokenizer.no_truncation()
        length = options.max_length if options.padding == "max_length" else None
        _set_padding(self.tokenizer, options.pad_token, length)
        named = {
            "ids": options.input_ids,
            "attention_mask": options.attention_mask,
            "type_ids": options.token_type_ids,
        }
        self._columns = {attribute: name for attribute, name in named.items() if name is not None}

    def process(self, tensors: Arrays) -> Arrays:
        source, pair = self.options.input, self.options.pair
        texts = self._texts(tensors, source)
        inputs: list[Any] = texts
        if pair is not None:
            second = self._texts(tensors, pair)
            if len(second) != len(texts):
                raise StepError(
                    f"inputs {source!r} and {pair!r} disagree on the batch size: "
                    f"{len(texts)} and {len(second)}"
                )
            inputs = list(zip(texts, second, strict=True))
        encodings = self.tokenizer.encode_batch_fast(
            inputs, add_special_tokens=self.options.add_special_tokens
        )
        if not self.options.truncation:
            self._check_lengths(encodings)
        length = self.options.max_length if self.options.padding == "max_length" else 0
        if encodings:
            length = len(encodings[0].ids)
        rest = {k: v for k, v in tensors.items() if k not in (source, pair)}
        for attribute, output in self._columns.items():
            rows = [getattr(encoding, attribute) for encoding in encodings]
            rest[output] = np.array(rows, dtype=np.int64).reshape(len(encodings), length)
        return rest

    def _texts(self, tensors: Arrays, name: str) -> list[str]:
        """Each text of `name`, cut to the bytes `max_length` tokens could take."""
        flat = strings(tensors, name, self.options.kind)
        limit = self.options.max_length * BYTES_PER_TOKEN
        return [
            utf8(self._cut(item, limit, name, index), f"input {name!r}", index, StepError)
            for index, item in enumerate(flat)
        ]

    def _cut(self, item: object, limit: int, name: str, index: int) -> object:
        """`item`'s first `limit` bytes, ending on a whole UTF-8 character; without
        truncation, a longer item is refused instead."""
        if not isinstance(item, bytes | bytearray) or len(item) <= limit:
            return item
        if not self.options.truncation:
            raise StepError(
                f"input {name!r}: element {index} is {len(item)} bytes long, more than "
                f"max_length {self.options.max_length} tokens can take ({limit} bytes)"
            )
        end = limit
        while end > 0 and item[end] & 0xC0 == 0x80:  # a continuation byte: back to its start
            end -= 1
        return bytes(item[:end])

    def _check_lengths(self, encodings: list[Encoding]) -> None:
        most = self.options.max_length
        for index, encoding in enumerate(encodings):
            tokens = sum(encoding.attention_mask)
            if tokens > most:
                raise StepError(
                    f"input {self.options.input!r}: element {index} has {tokens} tokens, "
                    f"more than max_length {most}"
                )


def _load_tokenizer(path: Path, relative: str) -> Tokenizer:
    from tokenizers import Tokenizer  # here: a deployment without text steps never loads it

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
