"""The result cache: bounded, with a time to live, keyed by what determines an answer.

The key is the pipeline, the model version that would answer, the request's input tensors
(name, datatype, shape and bytes) and the principal it answers (the client's identity, or ""
where the pipeline shares its cache), hashed with SHA-256: a cryptographic hash, so that no
client can craft an input whose key is another's, and the fastest such hash here (the CPU's
SHA instructions hash a 150 KB JPEG in half BLAKE2b's time). Partitioned so, a hit
(`strata.cached`) tells a client only what it sent itself, never whether someone else sent
the same input.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from strata.config.gateway import Cache
from strata.wire.stack import Raw


def cache_key(pipeline: str, version: str, inputs: Sequence[Raw], principal: str = "") -> str:
    digest = hashlib.sha256()
    digest.update(f"{pipeline}\0{version}\0{principal}\0".encode())
    for tensor in sorted(inputs, key=lambda t: t.name):
        digest.update(f"{tensor.name}\0{tensor.datatype}\0{tensor.shape}\0".encode())
        digest.update(tensor.data)
    return digest.hexdigest()


def consulted(settings: Cache, own_cache: bool, level: int, highest_level: int) -> bool:
    """Whether a request's answer is worth its key (a SHA-256 of its inputs) and its place:
    the cache holds some (`max_entries`), and the pipeline caches its answers (`own_cache`),
    or the ladder may reach level 3 (`highest_level`), where cached answers stand in for the
    chain's, and is at `keep_from_level` or above now (`level`): below it, no lookup could
    read the answer before the ladder had climbed there, keeping answers on its way."""
    if settings.max_entries <= 0:
        return False
    return own_cache or (highest_level >= 3 and level >= settings.keep_from_level)


@dataclass(frozen=True)
class Cached:
    outputs: dict[str, np.ndarray]
    arm: str
    model_version: str
    stages: str = ""  # a pipeline of several models: those that answered


class ResultCache:
    """Least recently used answers, each fresh for `ttl_seconds`: at most `max_entries`, and
    answers expired among the least recently used are dropped as new ones come, so that the
    memory held follows the answers of the last `ttl_seconds` rather than filling up to
    `max_entries` with stale ones."""

    def __init__(self, settings: Cache, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, Cached]] = OrderedDict()
        self.configure(settings)

    def configure(self, settings: Cache) -> None:
        self.settings = settings
        while len(self._entries) > settings.max_entries:
            self._entries.popitem(last=False)

    def get(self, key: str) -> Cached | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        expires, value = entry
        if expires < self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def put(self, key: str, value: Cached) -> None:
        """Keep `value` under `key`; its outputs are copied where they are views, so that an
        entry holds its own rows, never the whole flight's buffers they were sliced from."""
        if self.settings.max_entries == 0:
            return
        now = self._clock()
        owned = {name: a if a.base is None else a.copy() for name, a in value.outputs.items()}
        self._entries[key] = (now + self.settings.ttl_seconds, replace(value, outputs=owned))
        self._entries.move_to_end(key)
        if len(self._entries) > self.settings.max_entries:
            self._entries.popitem(last=False)
        self._drop_expired(now)

    def _drop_expired(self, now: float) -> None:
        """Drop expired answers from the least recently used end, up to the first fresh one
        (O(1) per answer stored, over time)."""
        while self._entries:
            expires, _ = next(iter(self._entries.values()))
            if expires >= now:
                return
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)
