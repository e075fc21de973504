"""A model version hot-swapped in after start, re-checked against the pipeline that calls it,
with real processes: deployment b's digits version 2 replaced on disk by a model that takes
other inputs is refused on load, naming the pipeline and the tensor, and the canary arm goes
on answering with the version it had."""

from __future__ import annotations

import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest

from strata import codec
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import ROOT, running_system

TOKEN = "inference-admin-token-for-the-rewiring-test-0123"


def test_a_hot_swapped_version_that_misfits_its_pipeline_is_refused(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    for model in ("digits", "tabular", "digits-large"):
        shutil.copytree(ROOT / "build" / "repository" / model, repository / model)
    changes = {"repository": str(repository), "inference": {"admin_token": TOKEN}}
    with running_system(tmp_path, changes) as system:
        canary = v2_grpc.GRPCInferenceServiceStub(
            grpc.insecure_channel(system.address("inference-b"))
        )
        swapped = repository / "digits" / "2"  # tabular's model and cases: features, not pixels
        shutil.rmtree(swapped)
        shutil.copytree(
            repository / "tabular" / "1", swapped, ignore=shutil.ignore_patterns("stats.json")
        )
        with pytest.raises(grpc.RpcError) as refused:
            canary.RepositoryModelLoad(
                v2.RepositoryModelLoadRequest(model_name="digits"),
                metadata=(("authorization", f"Bearer {TOKEN}"),),
                timeout=60,
            )
        request = codec.build_request("digits", {"pixels": np.zeros((1, 64), np.float32)}, "2")
        answer = canary.ModelInfer(request, timeout=10)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details() == (
        "model 'digits' version 2 refused: pipeline 'digits': its steps and rules were checked "
        "at start against model 'digits' version 2, and model 'digits' version 2 (loaded now) "
        "has input 'features', which model 'digits' version 2 has not; a version loaded later "
        "must take and give what they were checked against (restart preprocess and "
        "postprocess to check them against another); version 2 keeps serving"
    )
    assert answer.model_version == "2" and answer.outputs[0].name == "logits"
