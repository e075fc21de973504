"""Vocabulary lookup: strings to integer ids from a file loaded once at start-up.

The file lives beside the model: `.txt` with one entry per line (the id is the line number,
from 0), or `.json` holding a list (ids by position) or an object of entry -> id.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import InitVar, dataclass, field
from pathlib import Path

import numpy as np

from services.preprocess.steps.base import STEPS, resolve
from strata.config.preprocess import VocabularyStep
from strata.plugins import StepError, take
from strata.wire.codec import Arrays

# How much of an unknown entry an error message quotes.
_QUOTE = 40


@STEPS.register("vocabulary", repository=True)
@dataclass
class VocabularyLookup:
    """Each BYTES element to its id (INT64, same shape); unknown ones get `oov_id` or fail."""

    options: VocabularyStep
    repository: InitVar[Path]
    table: dict[bytes, int] = field(init=False, repr=False)

    def __post_init__(self, repository: Path) -> None:
        self.table = load_vocabulary(resolve(repository, self.options.vocabulary))

    def process(self, tensors: Arrays) -> Arrays:
        source, oov_id = self.options.input, self.options.oov_id
        values = take(tensors, source, self.options.kind)
        if values.dtype != object:
            raise StepError(
                f"input {source!r}: {self.options.kind} needs BYTES, got {values.dtype}"
            )
        flat = values.reshape(-1)
        missing = -1 if oov_id is None else oov_id
        ids = np.fromiter(
            (self.table.get(_key(item), missing) for item in flat), np.int64, count=flat.size
        )
        if oov_id is None and (ids == -1).any():
            index = int(np.argmax(ids == -1))
            quoted = repr(_key(flat[index])[:_QUOTE])
            raise StepError(
                f"input {source!r}: element {index} ({quoted}) is not in the vocabulary"
            )
        rest = {k: v for k, v in tensors.items() if k != source}
        return {**rest, self.options.target: ids.reshape(values.shape)}


def _key(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8")
    raise StepError(f"vocabulary lookup needs strings, got {type(item).__name__}")


def _numbered(entries: Sequence[object]) -> list[tuple[object, int]]:
    return [(entry, index) for index, entry in enumerate(entries)]


def load_vocabulary(path: Path) -> dict[bytes, int]:
    """Entry -> id; refuses repeated entries, repeated ids and negative ids."""
    if path.suffix == ".json":
        body = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(body, dict | list):
            raise ValueError(f"vocabulary {path.name} must hold a JSON list or object")
        entries = body.items() if isinstance(body, dict) else _numbered(body)
    else:
        entries = _numbered(path.read_text(encoding="utf-8").splitlines())
    pairs = list(entries)
    if not pairs:
        raise ValueError(f"vocabulary {path.name} is empty")
    table: dict[bytes, int] = {}
    for entry, index in pairs:
        if not isinstance(entry, str) or isinstance(index, bool) or not isinstance(index, int):
            raise ValueError(f"vocabulary {path.name}: {entry!r} -> {index!r} is not text -> id")
        if index < 0:
            raise ValueError(f"vocabulary {path.name}: {entry!r} has negative id {index}")
        key = entry.encode("utf-8")
        if key in table:
            raise ValueError(f"vocabulary {path.name}: {entry!r} appears more than once")
        table[key] = index
    if len(set(table.values())) != len(table):
        raise ValueError(f"vocabulary {path.name}: two entries share an id")
    return table
