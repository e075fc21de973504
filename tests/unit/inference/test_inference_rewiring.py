"""A version hot-swapped in after start is re-checked against the pipelines that call it: one
that takes or gives other tensors than the version checked at start is refused, naming the
pipeline and the tensor, while the version serving keeps serving."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from services.inference.manager import ModelManager
from services.inference.rewiring import Rewiring
from strata.config.pipelines import Pipeline
from strata.errors import NotReady
from tests.unit.inference.test_inference_repository import X, settings
from tests.unit.inference.test_inference_toymodels import dense, pooling_model, write_version

ALL = {"version_policy": {"all": True}}


def pipeline(version: str = "") -> Pipeline:
    return Pipeline.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
            "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 3]}],
            "model": {"name": "toy", "version": version},
        }
    )


def hot_swap(root: Path, called: str) -> tuple[NotReady | None, dict[str, list[str]]]:
    """Serve toy version 1 (x -> y), then load a version 2 that takes ids and mask instead,
    for a pipeline calling version `called`: the refusal (None if it loaded) and what serves."""
    write_version(root, "toy", 1, dense(1), [X], ALL)

    async def go() -> tuple[NotReady | None, dict[str, list[str]]]:
        rewiring = Rewiring({"p": pipeline(called)})
        manager = ModelManager(root, settings(), ThreadPoolExecutor(1), rewiring)
        try:
            await manager.start()
            write_version(root, "toy", 2, pooling_model())
            try:
                await manager.load("toy")
            except NotReady as exc:
                return exc, manager.serving()
            return None, manager.serving()
        finally:
            await manager.close()

    return asyncio.run(go())


def test_a_version_that_does_not_fit_its_pipeline_is_refused_and_the_old_one_serves(
    tmp_path: Path,
) -> None:
    refused, serving = hot_swap(tmp_path, "")
    assert refused is not None and serving == {"toy": ["1"]}
    assert str(refused) == (
        "model 'toy' version 2 refused: pipeline 'p': its steps and rules were checked at "
        "start against model 'toy' version 1, and model 'toy' version 2 (loaded now) has input "
        "'ids', "
        "which model 'toy' version 1 has not; a version loaded later must take and give what "
        "they were checked against (restart preprocess and postprocess to check them against "
        "another); version 1 keeps serving"
    )


def test_a_version_no_pipeline_calls_is_not_held_to_one(tmp_path: Path) -> None:
    refused, serving = hot_swap(tmp_path, "1")  # the pipeline pins version 1
    assert refused is None and serving == {"toy": ["1", "2"]}


def test_a_version_that_takes_and_gives_the_same_tensors_swaps_in(tmp_path: Path) -> None:
    write_version(tmp_path, "toy", 1, dense(1), [X])

    async def go() -> list[str]:
        manager = ModelManager(
            tmp_path, settings(), ThreadPoolExecutor(1), Rewiring({"p": pipeline()})
        )
        try:
            await manager.start()
            write_version(tmp_path, "toy", 2, dense(2), [X])
            await manager.load("toy")
            return manager.serving()["toy"]
        finally:
            await manager.close()

    assert asyncio.run(go()) == ["2"]


@pytest.mark.parametrize("called", ["", "1"])
def test_start_up_itself_is_not_rechecked(tmp_path: Path, called: str) -> None:
    """At start, preprocess and postprocess check every version themselves."""
    write_version(tmp_path, "toy", 1, pooling_model(), [], ALL)

    async def go() -> list[str]:
        rewiring = Rewiring({"p": pipeline(called)})
        manager = ModelManager(tmp_path, settings(), ThreadPoolExecutor(1), rewiring)
        try:
            await manager.start()
            return manager.serving()["toy"]
        finally:
            await manager.close()

    assert asyncio.run(go()) == ["1"]
