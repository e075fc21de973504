"""Model control for local development (gateway.local_model_control): tritonclient loads and
unloads a pipeline without any token, as Triton's examples do against a server in explicit
mode, while every listener is on loopback. The refusals (the default needs the token; a
listener off loopback refuses the setting at start) are in test_protocol.py and
tests/unit/test_config.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from strata.tools.launch import Supervisor
from tests.support.system import run_client, running_system


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    # No admin token anywhere: neither the gateway's nor inference's.
    changes = {"gateway": {"local_model_control": True}}
    with running_system(tmp_path_factory.mktemp("local-control"), changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def report(system: Supervisor) -> dict[str, Any]:
    gateway = system.settings.services.gateway
    return run_client("triton_control", gateway.listen, gateway.rest, "tabular")


def test_the_index_needs_no_token(report: dict[str, Any]) -> None:
    assert report["index"]["status"] == "OK" and report["index"]["value"] > 0


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_unload_and_load_need_no_token(report: dict[str, Any], protocol: str) -> None:
    cycle = report[protocol]
    assert cycle["unload"]["status"] == "OK", cycle
    assert cycle["ready_after_unload"] is False
    assert cycle["load"]["status"] == "OK", cycle
    assert cycle["ready_after_load"] is True
