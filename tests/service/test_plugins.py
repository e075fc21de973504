"""Plugins in the services that run them: over real gRPC, a plugin that fails on one row of a
flight fails only that row's request, UNAVAILABLE naming the stage; and of the four
services built from a config with plugins, only the two that run stages import them."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from services.postprocess.app import build as build_postprocess
from services.preprocess.app import build as build_preprocess
from strata.config import Settings, load_settings
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.main import Service
from strata.rpc.server import start_server
from tests.support.flight_requests import by_member, flight
from tests.support.system import ROOT, make_config

FRAGILE = "tests.support.plugins:Fragile"
PIPELINE = {
    "inputs": [{"name": "images", "datatype": "UINT8", "shape": [-1, 8, 8]}],
    "outputs": [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}],
    "preprocess": [
        {"kind": FRAGILE, "name": "fragile_step", "input": "images"},
        {"kind": "flatten", "input": "images", "output": "pixels"},
        {"kind": "cast", "input": "pixels", "datatype": "FP32"},  # what the model takes
    ],
    "model": {"name": "digits"},
    "postprocess": [
        {"kind": FRAGILE, "name": "fragile_rule", "input": "logits", "poison": 99},
        {"kind": "softmax", "input": "logits", "output": "probabilities"},
    ],
}


def shipped_pipeline() -> dict:
    """configs/plugins.yaml's pipeline of the example package's plugins."""
    pipelines = yaml.safe_load((ROOT / "configs" / "plugins.yaml").read_text())["pipelines"]
    return {"digits-cropped": pipelines["digits-cropped"]}


def config(folder: Path) -> Path:
    """The default config with the test's pipeline and the shipped plugin pipeline."""
    return make_config(folder, {"pipelines": {"fragile": PIPELINE, **shipped_pipeline()}})


@asynccontextmanager
async def served(
    build: Callable[[Settings], Awaitable[Service]], settings: Settings
) -> AsyncIterator[grpc.aio.Channel]:
    service = await build(settings)
    running = await start_server(service.registrations, "127.0.0.1:0", settings.server)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield channel
    finally:
        await channel.close()
        await running.server.stop(0)
        if service.on_stop is not None:
            await service.on_stop()


def fly(folder: Path, service: str, members: dict) -> dict:
    """A flight of `members` through `service` (preprocess or postprocess), built as its
    entry point builds it from the test's config; each member's outputs or error."""
    settings = load_settings(config(folder), service)
    build, stub = LAYERS[service]

    async def go() -> v1.Result:
        async with served(build, settings) as channel:
            request = v1.ProcessRequest(requests=[flight("fragile", members)])
            return (await stub(channel).Process(request)).results[0]

    return by_member(asyncio.run(go()))


LAYERS = {
    "preprocess": (build_preprocess, preprocess_pb2_grpc.PreprocessStub),
    "postprocess": (build_postprocess, postprocess_pb2_grpc.PostprocessStub),
}


def assert_failed_naming(outcome: object, stage: str) -> None:
    assert getattr(outcome, "code", None) == grpc.StatusCode.UNAVAILABLE
    assert str(outcome) == f"{stage} failed: RuntimeError: a poisoned row"


def test_a_plugin_step_failing_on_one_row_fails_only_that_request(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    rows = {"r0": 2, "r1": 1, "r2": 3}
    members = {r: {"images": rng.integers(0, 200, (n, 8, 8), np.uint8)} for r, n in rows.items()}
    members["r1"]["images"][0, 0, 0] = 255
    answers = fly(tmp_path, "preprocess", members)
    assert_failed_naming(answers["r1"], "preprocess step 'fragile_step'")
    for rid in ("r0", "r2"):
        images = members[rid]["images"]
        np.testing.assert_array_equal(answers[rid]["pixels"], images.reshape(len(images), -1))


def test_a_plugin_rule_failing_on_one_row_fails_only_that_request(tmp_path: Path) -> None:
    rows = {"r0": 1, "r1": 2, "r2": 1}
    members = {r: {"logits": np.ones((n, 10), np.float32)} for r, n in rows.items()}
    members["r2"]["logits"][0, 0] = 99
    answers = fly(tmp_path, "postprocess", members)
    assert_failed_naming(answers["r2"], "postprocess rule 'fragile_rule'")
    for rid in ("r0", "r1"):
        np.testing.assert_allclose(answers[rid]["probabilities"], 0.1)


# Which processes import plugin code: each service built as its entry point builds it, in an
# interpreter of its own, then the plugin modules it holds.
PACKAGE = "strata_example_plugins"
IMPORTED = """
import asyncio, importlib, json, sys
from strata.config import load_settings
service = sys.argv[2]
build = importlib.import_module(f"services.{service}.app").build
asyncio.run(build(load_settings(sys.argv[1], service)))
plugins = ("strata_example_plugins", "tests.support.plugins")
print(json.dumps(sorted(name for name in sys.modules if name.startswith(plugins))))
"""


@pytest.mark.parametrize(
    ("service", "modules"),
    [
        ("gateway", []),
        ("inference", []),
        (
            "preprocess",
            ["strata_example_plugins", "strata_example_plugins.crop", "tests.support.plugins"],
        ),
        (
            "postprocess",
            ["strata_example_plugins", "strata_example_plugins.uncertain", "tests.support.plugins"],
        ),
    ],
)
def test_only_preprocess_and_postprocess_import_plugin_code(
    tmp_path: Path, service: str, modules: list[str]
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", IMPORTED, str(config(tmp_path)), service],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == modules
