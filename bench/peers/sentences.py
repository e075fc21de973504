"""The text workload's steps as a user would write them, with tokenizers and numpy alone: the
embed pipeline's tokenizer (truncation at its max_length, padding to the longest) turning
sentences into MiniLM's INT64 inputs. Imported by the in-process loop and by MLServer's
runtime (bench/peers/mlserver_text.py), which runs in a venv of its own.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer

MAX_LENGTH = 256  # configs/text.yaml's embed pipeline


def tokenizer(path: str, max_length: int = MAX_LENGTH) -> Tokenizer:
    """The tokenizer file, set up as the preprocess service's tokenize step sets it up."""
    loaded = Tokenizer.from_file(path)
    loaded.enable_truncation(max_length)
    loaded.enable_padding(pad_token=(loaded.padding or {}).get("pad_token", "[PAD]"))
    return loaded


def features(loaded: Tokenizer, texts: list[str]) -> dict[str, np.ndarray]:
    """MiniLM's inputs for `texts`: token ids, attention mask, token type ids."""
    encodings = loaded.encode_batch_fast(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], np.int64),
    }
