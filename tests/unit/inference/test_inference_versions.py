"""Versions that live side by side: loading a new one leaves the others serving with their
counters, and a version that carries statistics other than those it was trained with is
refused while the others keep serving."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from services.inference.manager import ModelManager
from strata.errors import NotReady
from strata.models.normalisation import STATS_FILE, fit_stats, save_stats
from tests.unit.inference.test_inference_repository import X, answer, settings, with_manager
from tests.unit.inference.test_inference_toymodels import dense, write_manifest, write_version

ALL = {"version_policy": {"all": True}}


def stats_of(seed: int):
    return fit_stats(np.random.default_rng(seed).normal(size=(50, 4)))


@pytest.mark.parametrize(
    "edit",
    [
        {"version_policy": {"specific": [1, 2, 3]}},  # the operator names version 3
        {"version_policy": {"all": True}, "labels": ["a", "b", "c"]},  # another layer's key
    ],
)
def test_loading_version_3_keeps_versions_1_and_2_and_their_counters(
    tmp_path: Path, edit: dict
) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X], {"version_policy": {"specific": [1, 2]}})
    write_version(tmp_path, "toy", 2, dense(2), [X])

    async def body(manager: ModelManager) -> None:
        before = {v: manager.resolve("toy", v) for v in ("1", "2")}
        for v in ("1", "2", "1"):
            await answer(manager, v)
        write_version(tmp_path, "toy", 3, dense(3), [X])
        write_manifest(tmp_path, "toy", edit)
        await manager.load("toy")
        assert manager.serving() == {"toy": ["1", "2", "3"]}
        for v, model in before.items():
            assert manager.resolve("toy", v) is model, f"version {v} was reloaded"
        counts = {s.version: s.inference_count for s in manager.statistics("toy")}
        assert counts == {"1": 4, "2": 2, "3": 0}

    with_manager(tmp_path, body)


def test_a_change_to_how_a_version_loads_still_reloads_it(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X], ALL)

    async def body(manager: ModelManager) -> None:
        before = manager.resolve("toy", "1")
        write_manifest(tmp_path, "toy", {**ALL, "batching": {"max_queue_delay_ms": 1.0}})
        await manager.load("toy")
        reloaded = manager.resolve("toy", "1")
        assert reloaded is not before
        assert reloaded.spec.batching.max_queue_delay_ms == 1.0

    with_manager(tmp_path, body)


def test_each_version_serves_with_the_statistics_it_was_trained_with(tmp_path: Path) -> None:
    one, two = stats_of(1), stats_of(2)
    prints = {1: one.fingerprint, 2: two.fingerprint}
    write_version(tmp_path, "toy", 1, dense(1), [X], {**ALL, "preprocess_fingerprint": prints})
    write_version(tmp_path, "toy", 2, dense(2), [X])
    save_stats(one, tmp_path / "toy" / "1" / STATS_FILE)
    save_stats(two, tmp_path / "toy" / "2" / STATS_FILE)

    async def body(manager: ModelManager) -> None:
        assert manager.serving() == {"toy": ["1", "2"]}

    with_manager(tmp_path, body)


def test_a_version_whose_statistics_do_not_match_never_serves(tmp_path: Path) -> None:
    one, two = stats_of(1), stats_of(2)
    prints = {1: one.fingerprint, 2: two.fingerprint}
    write_version(tmp_path, "toy", 1, dense(1), [X], {**ALL, "preprocess_fingerprint": prints})
    save_stats(one, tmp_path / "toy" / "1" / STATS_FILE)

    async def body(manager: ModelManager) -> None:
        before = manager.resolve("toy", "1")
        write_version(tmp_path, "toy", 2, dense(2), [X])
        save_stats(one, tmp_path / "toy" / "2" / STATS_FILE)  # version 1's, not its own
        with pytest.raises(NotReady) as refused:
            await manager.load("toy")
        message = str(refused.value)
        assert f"toy/2/{STATS_FILE} has fingerprint {one.fingerprint}" in message
        assert f"records {two.fingerprint} for version 2" in message
        assert "version 1 keeps serving" in message
        assert manager.resolve("toy", "1") is before
        states = {(e.version, e.state) for e in manager.index()}
        assert states == {("1", "READY"), ("2", "UNAVAILABLE")}
        assert str(tmp_path) not in message

    with_manager(tmp_path, body)


def test_an_edited_stats_file_is_refused(tmp_path: Path) -> None:
    stats = stats_of(1)
    write_version(tmp_path, "toy", 1, dense(1), [X], {"preprocess_fingerprint": stats.fingerprint})
    save_stats(stats, tmp_path / "toy" / "1" / STATS_FILE)
    path = tmp_path / "toy" / "1" / STATS_FILE
    body = json.loads(path.read_text())
    body["mean"][0] += 1.0  # edited by hand: the values no longer have the file's fingerprint
    path.write_text(json.dumps(body))

    async def go() -> None:
        manager = ModelManager(tmp_path, settings(), ThreadPoolExecutor(1))
        try:
            with pytest.raises(
                NotReady, match=f"cannot read toy/1/{STATS_FILE}: fingerprint does not match"
            ):
                await manager.start()
        finally:
            await manager.close()

    asyncio.run(go())
