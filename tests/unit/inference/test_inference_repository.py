"""The model repository and its manager, in process: model.yaml, version policies, loads,
validated swaps, refusals, unloads, polling, and memory across repeated swaps."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import shutil
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import psutil
import pytest

from services.inference.jobs import Request
from services.inference.manager import ModelManager
from services.inference.manifest import VersionPolicy, read_spec
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, NotFound, NotReady
from tests.unit.inference.test_inference_toymodels import (
    dense,
    run,
    write_case,
    write_manifest,
    write_version,
)

X = {"x": np.arange(8, dtype=np.float32).reshape(2, 4)}


def settings(**changes: object) -> InferenceSettings:
    return InferenceSettings(**{"models": ["toy"], "workers": 2, **changes})


def with_manager(
    root: Path, body: Callable[[ModelManager], Awaitable[None]], **changes: object
) -> None:
    async def go() -> None:
        manager = ModelManager(root, settings(**changes), ThreadPoolExecutor(2))
        try:
            await manager.start()
            await body(manager)
        finally:
            await manager.close()

    asyncio.run(go())


async def answer(manager: ModelManager, version: str = "") -> tuple[int, np.ndarray]:
    model = manager.resolve("toy", version)
    return model.version, (await model.infer(X, Request()))["y"]


@pytest.mark.parametrize(
    ("policy", "served"),
    [({"latest": 2}, [3, 5]), ({"all": True}, [1, 3, 5]), ({"specific": [1, 5, 9]}, [1, 5])],
)
def test_version_policies_pick_versions(policy: dict, served: list[int]) -> None:
    assert VersionPolicy(**policy).select([5, 1, 3]) == served
    assert VersionPolicy().select([5, 1, 3]) == [5]


def test_model_yaml_overrides_defaults_and_keeps_other_keys(tmp_path: Path) -> None:
    write_manifest(
        tmp_path,
        "toy",
        {"labels": ["a"], "batching": {"policy": "fixed"}, "session": {"intra_op_threads": 2}},
    )
    spec = read_spec(tmp_path / "toy" / "model.yaml", settings())
    assert spec.batching.policy == "fixed" and spec.batching.max_queue_rows == 1024
    assert spec.session.intra_op_threads == 2 and spec.concurrency == 2
    assert spec.manifest.model_extra == {"labels": ["a"]}


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        ({"batching": {"policy": "sometimes"}}, "batching.policy"),
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"version_policy": {"latest": 1, "all": True}}, "only one of latest"),
        ({"session": {"execution_providers": ["Nope"]}}, "not an execution provider"),
    ],
)
def test_a_bad_model_yaml_is_refused_naming_the_field(
    tmp_path: Path, manifest: dict, words: str
) -> None:
    write_manifest(tmp_path, "toy", manifest)
    with pytest.raises(NotReady, match=words) as info:
        read_spec(tmp_path / "toy" / "model.yaml", settings())
    assert "toy/model.yaml" in str(info.value) and str(tmp_path) not in str(info.value)


def test_no_refusal_names_the_servers_path_to_the_repository(tmp_path: Path) -> None:
    write_version(tmp_path, "ok", 1, dense(1), [X])
    write_version(tmp_path, "toy", 1, dense(1), [X])
    (tmp_path / "toy" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    write_version(tmp_path, "bare", 1, dense(1), [X])
    (tmp_path / "bare" / "1" / "model.onnx").unlink()

    async def body(manager: ModelManager) -> None:
        refusals = []
        for name in ("toy", "bare", "ghost"):
            with pytest.raises((NotReady, NotFound)) as info:
                await manager.load(name)
            refusals.append(str(info.value))
        refusals += [entry.reason for entry in manager.index()]
        assert not [r for r in refusals if str(tmp_path) in r], refusals
        assert "model.onnx is missing from bare/1" in refusals[1]
        assert "no folder ghost/" in refusals[2]

    with_manager(tmp_path, body, models=["ok"])


def test_loads_serve_the_latest_and_pick_up_a_new_version(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        assert (await answer(manager))[0] == 1
        write_version(tmp_path, "toy", 2, dense(2), [X])
        await manager.load("toy")
        version, y = await answer(manager)
        assert version == 2
        np.testing.assert_allclose(y, run(dense(2), X)["y"], rtol=1e-5)
        with pytest.raises(NotFound, match="no version '1' serving"):
            manager.resolve("toy", "1")
        states = {(e.version, e.state, e.reason) for e in manager.index()}
        assert states == {("1", "UNAVAILABLE", "unloaded"), ("2", "READY", "")}

    with_manager(tmp_path, body)


def test_a_version_whose_files_change_reloads_in_place(tmp_path: Path) -> None:
    folder = write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        write_version(tmp_path, "toy", 1, dense(2), [X])
        os.utime(folder / "model.onnx", ns=(1, 1))  # a different stamp, whatever the clock
        await manager.load("toy")
        version, y = await answer(manager)
        assert version == 1
        np.testing.assert_allclose(y, run(dense(2), X)["y"], rtol=1e-5)
        assert [(e.version, e.state) for e in manager.index()] == [("1", "READY")]

    with_manager(tmp_path, body)


def test_policy_all_serves_every_version_and_answers_with_the_highest(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X], {"version_policy": {"all": True}})
    write_version(tmp_path, "toy", 2, dense(2), [X])

    async def body(manager: ModelManager) -> None:
        assert manager.serving() == {"toy": ["1", "2"]}
        assert (await answer(manager))[0] == 2
        _, y = await answer(manager, "1")
        np.testing.assert_allclose(y, run(dense(1), X)["y"], rtol=1e-5)

    with_manager(tmp_path, body)


@pytest.mark.parametrize(
    ("breakage", "reason"),
    [
        ("corrupt", "cannot open model.onnx"),
        ("validation", "validation case 'case_000' output 'y' differs by"),
        ("missing", "model.onnx is missing"),
    ],
)
def test_a_broken_version_is_refused_and_the_old_keeps_serving(
    tmp_path: Path, breakage: str, reason: str
) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        folder = write_version(tmp_path, "toy", 2, dense(2), [X])
        if breakage == "corrupt":
            (folder / "model.onnx").write_bytes(b"\x08\x07 this is not a model")
        elif breakage == "validation":
            write_case(folder / "validation" / "case_000.npz", X, run(dense(3), X))
        else:
            (folder / "model.onnx").unlink()
        with pytest.raises(NotReady, match=f"version 2 refused: {reason}.*version 1 keeps serving"):
            await manager.load("toy")
        assert (await answer(manager))[0] == 1
        entries = {e.version: e for e in manager.index()}
        assert entries["1"].state == "READY"
        assert entries["2"].state == "UNAVAILABLE"
        assert entries["2"].reason.startswith(reason)

    with_manager(tmp_path, body)


def test_unload_then_load_again(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        await manager.unload("toy")
        with pytest.raises(NotReady, match="not loaded; load it with RepositoryModelLoad"):
            manager.resolve("toy")
        assert [(e.version, e.reason) for e in manager.index()] == [("1", "unloaded")]
        await manager.load("toy")
        assert (await answer(manager))[0] == 1

    with_manager(tmp_path, body)


def test_unknown_and_unsafe_names(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        with pytest.raises(NotFound, match="'ghost' is not in the repository"):
            await manager.load("ghost")
        with pytest.raises(InvalidArgument, match="must be letters"):
            await manager.load("../toy")
        with pytest.raises(NotFound, match="unknown model 'ghost'"):
            manager.resolve("ghost")

    with_manager(tmp_path, body)


@pytest.mark.parametrize(
    ("name", "version", "words"),
    [
        ("toy", "\u00b2", ["version '\u00b2'", "1 to 18 digits"]),
        ("toy", "9" * 5000, ["version '99", "(5000 characters)", "1 to 18 digits"]),
        ("toy", "-1", ["version '-1'", "1 to 18 digits"]),
        ("t" * 5000, "", ["model name 'ttt", "(5000 characters)", "limit of 255"]),
        ("../toy", "", ["must be letters"]),
    ],
)
def test_malformed_names_and_versions_are_invalid_argument(
    tmp_path: Path, name: str, version: str, words: list[str]
) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        for lookup in (manager.resolve, manager.statistics):
            with pytest.raises(InvalidArgument) as info:
                lookup(name, version)
            assert all(word in str(info.value) for word in words), str(info.value)
            assert len(str(info.value)) < 200
        if not version:
            for change in (manager.load, manager.unload):
                with pytest.raises(InvalidArgument, match=re.escape(words[-1])):
                    await change(name)
        assert not manager.ready(name, version)

    with_manager(tmp_path, body)


def test_well_formed_but_unknown_names_and_versions_are_not_found(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        for name, version in [("toy", "7"), ("toy", "0"), ("g" * 255, ""), ("ghost", "1")]:
            with pytest.raises(NotFound):
                manager.resolve(name, version)
            assert not manager.ready(name, version)
        assert manager.resolve("toy", "001").version == 1
        for change in (manager.load, manager.unload):
            with pytest.raises(NotFound):
                await change("g" * 255)
        assert "g" * 255 not in manager._locks

    with_manager(tmp_path, body)


def test_poll_mode_picks_up_a_new_version(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def body(manager: ModelManager) -> None:
        write_version(tmp_path, "toy", 2, dense(2), [X])
        for _ in range(100):
            await asyncio.sleep(0.02)
            if manager.serving()["toy"] == ["2"]:
                break
        assert (await answer(manager))[0] == 2

    with_manager(tmp_path, body, poll_seconds=0.05)


def test_poll_mode_retires_a_version_whose_folder_is_gone(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X], {"version_policy": {"all": True}})
    folder = write_version(tmp_path, "toy", 2, dense(2), [X])

    async def body(manager: ModelManager) -> None:
        assert manager.serving()["toy"] == ["1", "2"]
        shutil.rmtree(folder)
        for _ in range(100):
            await asyncio.sleep(0.02)
            if manager.serving()["toy"] == ["1"]:
                break
        assert (await answer(manager))[0] == 1
        assert [e.version for e in manager.index()] == ["1"]

    with_manager(tmp_path, body, poll_seconds=0.05)


def rss() -> int:
    gc.collect()
    return psutil.Process(os.getpid()).memory_info().rss


@pytest.mark.slow
def test_repeated_swaps_and_unloads_do_not_grow_memory(tmp_path: Path) -> None:
    # 512x512 weights: each session holds about 1 MB of initializers plus its arenas.
    x = {"x": np.ones((4, 512), np.float32)}
    for version in (1, 2):
        write_version(tmp_path, "toy", version, dense(version, 512, 512, hidden=512), [x])
    write_manifest(tmp_path, "toy", {"version_policy": {"specific": [1]}})

    async def cycle(manager: ModelManager, version: int) -> None:
        write_manifest(tmp_path, "toy", {"version_policy": {"specific": [version]}})
        await manager.load("toy")
        model = manager.resolve("toy")
        assert model.version == version
        await asyncio.gather(*(model.infer(x, Request()) for _ in range(4)))

    async def body(manager: ModelManager) -> None:
        for i in range(8):  # warm up allocators
            await cycle(manager, 1 + i % 2)
        before = rss()
        for i in range(30):
            await cycle(manager, 1 + i % 2)
            if i % 5 == 4:
                await manager.unload("toy")
        grown = rss() - before
        assert grown < 24 * 2**20, f"RSS grew {grown / 2**20:.1f} MiB over 30 swaps"

    with_manager(tmp_path, body)
