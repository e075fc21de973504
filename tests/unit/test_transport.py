"""gRPC's environment in a service process, set before anything imports grpc, which reads it
then: its older TCP transport unless the operator set GRPC_EXPERIMENTS
(strata/process/transport.py says what it saves), and its C core's own log lines kept to
errors unless the operator set GRPC_VERBOSITY (strata/process/grpc_logs.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from strata.process.grpc_logs import QUIET
from strata.process.transport import POLLING_TRANSPORT

pytestmark = pytest.mark.slow  # each test starts a Python process

# Imports a service's entry module and says what a variable was when grpc was imported.
ENTRY = """
import importlib, importlib.abc, os, sys

class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "grpc":
            print(os.environ.get(sys.argv[2], "(unset)"))
            sys.meta_path.remove(self)
        return None

sys.meta_path.insert(0, Watch())
importlib.import_module(sys.argv[1])
"""


def seen_by_grpc(module: str, variable: str = "GRPC_EXPERIMENTS", **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k != variable}
    run = subprocess.run(
        [sys.executable, "-c", ENTRY, module, variable],
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


@pytest.mark.parametrize("service", ["gateway", "postprocess"])
def test_a_service_keeps_grpcs_core_to_its_errors(service: str) -> None:
    assert seen_by_grpc(f"services.{service}.__main__", "GRPC_VERBOSITY") == QUIET


def test_an_operators_own_grpc_log_level_wins() -> None:
    seen = seen_by_grpc("services.gateway.__main__", "GRPC_VERBOSITY", GRPC_VERBOSITY="DEBUG")
    assert seen == "DEBUG"
