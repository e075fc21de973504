"""The result cache (services/gateway/flow/cache.py): bounded, expiring, and keyed by all
that makes an answer: the pipeline, the arm's version, the inputs and, unless shared, the
client."""

import numpy as np

from services.gateway.flow.cache import Cached, ResultCache, cache_key, consulted
from strata.config.gateway import Cache
from strata.wire import codec
from strata.wire.stack import Raw
from tests.support.clock import Clock


def test_cache_is_bounded_and_expires() -> None:
    clock = Clock()
    cache = ResultCache(Cache(max_entries=2, ttl_seconds=10), clock)
    answer = Cached({"y": np.ones(1)}, "a", "1")
    for key in ("k1", "k2", "k3"):
        cache.put(key, answer)
    hit = cache.get("k3")
    assert cache.get("k1") is None and hit is not None and len(cache) == 2
    assert hit.outputs["y"] is answer.outputs["y"]  # its own array already: kept, not copied
    clock.now += 11
    assert cache.get("k3") is None


def test_an_entry_holds_its_own_rows_not_the_flights_buffer() -> None:
    flight = np.arange(16 * 384, dtype=np.float32).reshape(16, 384)  # a flight's decoded output
    cache = ResultCache(Cache(max_entries=4, ttl_seconds=10), Clock())
    cache.put("k", Cached({"embedding": flight[3:4]}, "a", "1"))
    hit = cache.get("k")
    assert hit is not None and hit.outputs["embedding"].base is None
    np.testing.assert_array_equal(hit.outputs["embedding"], flight[3:4])


def raw(name: str, array: np.ndarray) -> list[Raw]:
    return [Raw(name, codec.datatype_of(array), array.shape, codec.to_raw(array))]


def test_cache_key_depends_on_inputs_version_and_pipeline() -> None:
    x = raw("x", np.arange(4, dtype=np.float32))
    key = cache_key("p", "a:1", x)
    assert key == cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float32)))
    assert key != cache_key("p", "a:2", x)
    assert key != cache_key("q", "a:1", x)
    assert key != cache_key("p", "a:1", raw("y", np.arange(4, dtype=np.float32)))
    assert key != cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float64)))
    assert key != cache_key("p", "a:1", raw("x", np.arange(4, dtype=np.float32).reshape(2, 2)))
    assert key != cache_key("p", "a:1", x, "id:alice") != cache_key("p", "a:1", x, "id:bob")


def test_answers_are_keyed_only_where_the_cache_may_be_consulted() -> None:
    """A pipeline's own cache makes its answers worth a key at every level; a ladder that
    may reach level 3 (cached answers stand in there) only from `keep_from_level` up, so
    that a calm gateway hashes nothing; a cache of no entries never does."""
    held, disabled = Cache(max_entries=10), Cache(max_entries=0)
    every = Cache(max_entries=10, keep_from_level=0)
    assert consulted(held, own_cache=True, level=0, highest_level=0)
    assert not consulted(held, own_cache=False, level=0, highest_level=4)
    assert consulted(held, own_cache=False, level=1, highest_level=4)
    assert consulted(held, own_cache=False, level=3, highest_level=3)
    assert consulted(every, own_cache=False, level=0, highest_level=4)
    assert not consulted(held, own_cache=False, level=2, highest_level=2)
    assert not consulted(disabled, own_cache=True, level=4, highest_level=4)
