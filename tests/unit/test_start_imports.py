"""What each process imports as it starts: only what its layer serves with, so a start costs
the CPU of its own work (bench/startup.py measures it). A library a layer never needs, or needs
only for a feature the deployment may not use, is imported where it is used, if at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from strata.process.zygote import PRELOAD

pytestmark = pytest.mark.slow  # each test starts a Python process that imports a service

# Imports a module as `python -m` would start it, and says which modules were loaded and
# which entry-point groups were searched on the way.
IMPORTS = """
import importlib, importlib.metadata as metadata, json, sys
searched = []
find = metadata.entry_points
def entry_points(**params):
    searched.append(params.get("group"))
    return find(**params)
metadata.entry_points = entry_points
importlib.import_module(sys.argv[1])
print(json.dumps({"modules": sorted(sys.modules), "searched": searched}))
"""

MODELS = ("onnxruntime", "onnx", "torch", "transformers")
IMAGES_AND_TEXT = ("PIL", "tokenizers", "regex")
REST = ("uvicorn", "starlette")
# Per entry module: what it must not import as it starts.
NEVER = {
    "services.gateway.__main__": (*MODELS, *IMAGES_AND_TEXT),
    # Text steps import tokenizers when a tokenizer is loaded.
    "services.preprocess.__main__": (*MODELS, "tokenizers", "regex", *REST),
    # onnx only to fold a pipeline's tail into a model (services/inference/fold.py).
    "services.inference.__main__": (*MODELS[1:], *IMAGES_AND_TEXT, *REST),
    # regex where a filter rule is built.
    "services.postprocess.__main__": (*MODELS, *IMAGES_AND_TEXT, *REST),
    # The launcher imports the health check once its children are started; numpy only for
    # the banner it prints once all are up.
    "strata.tools.launch": (
        *MODELS,
        *IMAGES_AND_TEXT,
        *REST,
        "numpy",
        "strata.tools.healthcheck",
        "strata.rpc.server",
        "opentelemetry.sdk",
        "prometheus_client",
    ),
    # What the launcher polls its children with (and a container's probe): a channel and
    # the health stub, not the serving stack.
    "strata.tools.healthcheck": (
        *MODELS,
        *IMAGES_AND_TEXT,
        *REST,
        "strata.rpc.server",
        "opentelemetry.sdk",
    ),
}


def started(module: str) -> dict[str, list[str]]:
    run = subprocess.run(
        [sys.executable, "-c", IMPORTS, module],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(run.stdout)


@pytest.mark.parametrize("module", sorted(NEVER))
def test_a_process_imports_only_what_it_serves_with(module: str) -> None:
    seen = started(module)
    loaded = {name.split(".")[0] for name in seen["modules"]} | set(seen["modules"])
    assert sorted(loaded & set(NEVER[module])) == []
    # pydantic's own plugin search reads every installed distribution's metadata
    # (strata/process/pydantic_plugins.py).
    assert "pydantic" not in seen["searched"]


LAYERS = sorted(module for module in NEVER if module.startswith("services."))


@pytest.mark.parametrize("module", LAYERS)
def test_the_zygote_preloads_only_what_every_layer_imports(module: str) -> None:
    """A module the zygote preloads that a layer does not import would be memory and a
    start's CPU spent for nothing in that layer (strata/process/zygote.py)."""
    assert sorted(set(PRELOAD) - set(started(module)["modules"])) == []
