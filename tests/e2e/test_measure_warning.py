"""A cascade whose default measure sends every validation row to its large model, with real
processes: the gateway starts, serves, and its log says which measure the condition took and
that it tells none of the rows apart."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import numpy as np

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import running_system

STAGE = {
    "name": "large",
    "model": {"name": "digits-large"},
    "inputs": {"pixels": "pixels"},
    "when": {"tensor": "logits", "below": 1.0},  # top_probability is never 1: every row
}


def test_the_gateway_warns_of_a_default_measure_that_sends_every_row(tmp_path: Path) -> None:
    changes = {"pipelines": {"digits-cascade": {"stages": [STAGE]}}}
    with running_system(tmp_path, changes) as system:
        gateway = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        request = codec.build_request("digits-cascade", {"images": np.zeros((1, 8, 8), np.uint8)})
        answer = gateway.ModelInfer(request, timeout=10)
        lines = (system.log_dir / "gateway.log").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    warned = [
        e["msg"] for e in events if e.get("level") == "WARNING" and "default measure" in e["msg"]
    ]
    assert warned == [
        "pipeline 'digits-cascade': stage 'large' runs when top_probability (the default "
        "measure) of 'logits' is below 1.0, which sends all of the 21 rows of model 'digits' "
        "version 1's validation cases to it; no measure tells them apart at this bound: check "
        "the bound"
    ]
    assert answer.parameters["strata.stages"].string_param.endswith("large")
