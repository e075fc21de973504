"""Ready means every pipeline can answer: the shipped text config started as `make run` starts
it, a client that waits for ServerReady (as tritonclient users and Kubernetes do) sends
`embed` the moment it says true and gets its answer, though deployment b (digits only) is up
long before deployment a has loaded the text models. A request sent while its deployment is
still starting waits for it instead of failing at once, and the lenient readiness of
`gateway.ready_when: any_deployment` is what it says."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import yaml

from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import ROOT, endpoint, free_port, merge

CONFIG = ROOT / "configs" / "text.yaml"
REPOSITORY = ROOT / "build" / "repository"
TOKEN = "readiness-admin-token-of-at-least-32-chars"
STARTS = 3
TEXT = np.array([b"ready when it says so"], dtype=object)


def text_config(folder: Path, changes: dict | None = None) -> Path:
    """configs/text.yaml whole, on free loopback ports, with `changes` merged in."""
    missing = [m for m in ("minilm", "topics") if not (REPOSITORY / m / "1").is_dir()]
    if missing:
        pytest.fail(f"text models {missing} are not built: run `make models-text`")
    raw = yaml.safe_load(CONFIG.read_text())
    raw["repository"] = str(REPOSITORY)
    raw["services"] = {
        "gateway": {**endpoint(), "rest": f"127.0.0.1:{free_port()}"},
        "preprocess": endpoint(raw["services"]["preprocess"].get("replicas", 1)),
        "postprocess": endpoint(),
        "inference": {name: endpoint() for name in raw["services"]["inference"]},
    }
    raw["server"]["grace_seconds"] = 2
    path = folder / "text.yaml"
    path.write_text(yaml.safe_dump(merge(raw, changes or {}), allow_unicode=True))
    return path


# A request may wait for a deployment that is still starting as long as its deadline and
# the hop's ceiling allow: loading the text models takes longer than the default ceiling.
CHANGES = {"gateway": {"admin_token": TOKEN, "upstream_timeout_seconds": 120}}


@pytest.fixture
def launched(tmp_path: Path) -> Iterator[Supervisor]:
    """Not yet started: the test decides what to start and what to wait for."""
    config = text_config(tmp_path, CHANGES)
    supervisor = Supervisor(config, load_settings(config), log_dir=tmp_path)
    try:
        yield supervisor
    finally:
        supervisor.stop_all()


def server_ready(stub: v2_grpc.GRPCInferenceServiceStub) -> bool | None:
    """ServerReady's answer; None while the gateway does not answer yet."""
    try:
        return stub.ServerReady(v2.ServerReadyRequest(), timeout=2).ready
    except grpc.RpcError:
        return None


def embed(stub: v2_grpc.GRPCInferenceServiceStub, timeout: float) -> np.ndarray:
    reply = stub.ModelInfer(codec.build_request("embed", {"text": TEXT}), timeout=timeout)
    return codec.response_outputs(reply)["embedding"]


@pytest.mark.parametrize("start", range(STARTS))
def test_embed_answers_the_moment_server_ready_says_true(launched: Supervisor, start: int) -> None:
    # The gateway first, so that the race is run whatever the machine's load: the client
    # asks while the gateway is up and the layers behind it are still starting.
    launched.start("gateway")
    for name in launched.instances:
        if name != "gateway":
            launched.spawn(name)
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(launched.address("gateway")))
    answers = []
    end = time.monotonic() + 180
    while not answers or answers[-1] is not True:
        assert launched.failed() is None, f"{launched.failed()} exited while starting"
        assert time.monotonic() < end, "never ready"
        answers.append(server_ready(stub))
        time.sleep(0.02)
    assert embed(stub, timeout=10).shape == (1, 384)
    # The client asked while the gateway was up and not yet ready: the race was run.
    assert False in answers, "the gateway came up after everything else: nothing was tested"


def test_a_request_waits_for_its_deployment_to_start(launched: Supervisor) -> None:
    """Strict readiness says not ready while deployment a is down; the lenient setting says
    ready; and an `embed` sent then, the moment deployment a is started, waits for it to load
    its models instead of failing UNAVAILABLE at once."""
    others = [name for name in launched.instances if name != "inference-a"]
    for name in others:
        launched.spawn(name)
    launched.await_serving(*others, timeout=120)
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(launched.address("gateway")))
    rest = f"http://{launched.settings.services.gateway.rest}/v2/health/ready"
    assert server_ready(stub) is False
    assert requests.get(rest, timeout=5).status_code == 400

    raw = merge(
        yaml.safe_load(launched.config.read_text()), {"gateway": {"ready_when": "any_deployment"}}
    )
    launched.config.write_text(yaml.safe_dump(raw, allow_unicode=True))
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(launched.address("gateway")))
    auth = (("authorization", f"Bearer {TOKEN}"),)
    assert "gateway.ready_when" in admin.Reload(admin_pb2.ReloadRequest(), metadata=auth).applied
    assert server_ready(stub) is True  # deployment b is up: lenient, and wrong for embed

    launched.spawn("inference-a")
    started = time.monotonic()
    assert embed(stub, timeout=120).shape == (1, 384)
    assert launched.failed() is None
    assert time.monotonic() - started > 1, "answered before a could load: nothing waited"
