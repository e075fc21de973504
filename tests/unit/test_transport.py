"""gRPC's transport in a service process: its older TCP one unless the operator set
GRPC_EXPERIMENTS, set before anything imports grpc, which reads the variable then
(strata/process/transport.py says what it saves)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from strata.process.transport import POLLING_TRANSPORT

pytestmark = pytest.mark.slow  # each test starts a Python process

# Imports a service's entry module and says what GRPC_EXPERIMENTS was when grpc was imported.
ENTRY = """
import importlib, importlib.abc, os, sys

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "grpc":
            print(os.environ.get("GRPC_EXPERIMENTS", "(unset)"))
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
"""


def seen_by_grpc(module: str, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    run = subprocess.run(
        [sys.executable, "-c", ENTRY, module],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return run.stdout.strip()


@pytest.mark.parametrize("service", ["gateway", "preprocess", "inference", "postprocess"])
def test_a_service_runs_the_polling_transport(service: str) -> None:
    assert seen_by_grpc(f"services.{service}.__main__") == POLLING_TRANSPORT


def test_an_operators_own_experiments_win() -> None:
    own = "-event_engine_dns"
    assert seen_by_grpc("services.gateway.__main__", GRPC_EXPERIMENTS=own) == own
