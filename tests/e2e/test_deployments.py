"""Each inference deployment, as its own process, loads only the models its routes name, and
says which deployment it is in its log lines and metrics."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import free_port, running_system


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, Path]]:
    folder = tmp_path_factory.mktemp("deployments")
    metrics = {d: {"metrics": f"127.0.0.1:{free_port()}"} for d in ("a", "b")}
    with running_system(folder, {"services": {"inference": metrics}}) as system:
        gateway = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        for arm in ("control", "canary"):
            request = codec.build_request("digits", {"images": np.zeros((1, 8, 8), np.uint8)})
            request.parameters["strata.arm"].string_param = arm
            gateway.ModelInfer(request, timeout=10)
        yield system, folder


def logged(path: Path) -> list[dict]:
    """The JSON log lines of a process (not what libraries print on their own)."""
    return [json.loads(line) for line in path.open() if line.startswith("{")]


def ready(system: Supervisor, deployment: str, model: str) -> bool:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address(deployment)))
    return stub.ModelReady(v2.ModelReadyRequest(name=model), timeout=5).ready


def test_the_canary_deployment_loads_only_the_model_it_canaries(system) -> None:
    system, _ = system
    assert ready(system, "inference-a", "digits") and ready(system, "inference-a", "tabular")
    assert ready(system, "inference-b", "digits")
    assert not ready(system, "inference-b", "tabular")


def test_log_lines_and_metrics_name_the_deployment(system) -> None:
    system, folder = system
    for deployment in ("a", "b"):
        lines = logged(folder / f"inference-{deployment}.log")
        assert lines and {(x["service"], x.get("deployment")) for x in lines} == {
            ("inference", deployment)
        }
        address = system.settings.services.inference[deployment].metrics
        with urllib.request.urlopen(f"http://{address}/metrics", timeout=5) as page:
            families = {f.name: f for f in text_string_to_metric_families(page.read().decode())}
        answered = [
            s for s in families["strata_inference_requests"].samples if s.labels["outcome"] == "ok"
        ]
        assert {(s.labels["deployment"], s.labels["model"]) for s in answered} >= {
            (deployment, "digits")
        }
        assert {s.labels["deployment"] for s in answered} == {deployment}
        assert sum(s.value for s in answered if s.labels["model"] == "digits") == 1
    preprocess = logged(folder / "preprocess-0.log")
    assert preprocess and not any("deployment" in x for x in preprocess)
