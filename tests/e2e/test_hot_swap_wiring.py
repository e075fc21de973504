"""A model version hot-swapped in after start, re-checked against the pipeline that calls it,
with real processes: deployment b's digits version 2 replaced on disk by a model that takes
other inputs, or its input of another size than preprocess makes, is refused on load, naming
the pipeline, the stage and the tensor, and the canary arm goes on answering with the version
it had."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnx
import pytest

from models.onnx_export import dense_model
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import ROOT, running_system

TOKEN = "inference-admin-token-for-the-rewiring-test-0123"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@dataclass(frozen=True)
class Swapping:
    """A system serving its own copy of the demo repository, and inference-b's stub."""

    repository: Path
    canary: v2_grpc.GRPCInferenceServiceStub


# One system for the module: each test's swap is refused and version 2 keeps serving (what
# they assert), and each puts version 2 back on disk and loads it again, so the next test
# meets the system as it started.
@pytest.fixture(scope="module")
def swapping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Swapping]:
    repository = tmp_path_factory.mktemp("hot-swap") / "repository"
    for model in ("digits", "tabular", "digits-large"):
        shutil.copytree(ROOT / "build" / "repository" / model, repository / model)
    changes = {"repository": str(repository), "inference": {"admin_token": TOKEN}}
    with running_system(repository.parent, changes) as system:
        channel = grpc.insecure_channel(system.address("inference-b"))
        yield Swapping(repository, v2_grpc.GRPCInferenceServiceStub(channel))


def load_digits(canary: v2_grpc.GRPCInferenceServiceStub) -> None:
    request = v2.RepositoryModelLoadRequest(model_name="digits")
    canary.RepositoryModelLoad(request, metadata=AUTH, timeout=60)


def refused_load(swapping: Swapping, swap: Callable[[Path], None]) -> tuple[grpc.RpcError, Any]:
    """Version 2 of digits swapped on disk by `swap` and loaded on deployment b: the refusal,
    and then the canary's answer. Version 2 is put back and loaded again afterwards."""
    swapped = swapping.repository / "digits" / "2"
    original = swapping.repository.parent / "digits-2"
    shutil.move(swapped, original)
    try:
        swap(swapped)
        with pytest.raises(grpc.RpcError) as refused:
            load_digits(swapping.canary)
        request = codec.build_request("digits", {"pixels": np.zeros((1, 64), np.float32)}, "2")
        return refused.value, swapping.canary.ModelInfer(request, timeout=10)
    finally:
        shutil.rmtree(swapped, ignore_errors=True)
        shutil.move(original, swapped)
        load_digits(swapping.canary)


def test_a_hot_swapped_version_that_misfits_its_pipeline_is_refused(swapping: Swapping) -> None:
    def tabular(swapped: Path) -> None:  # tabular's model and cases: features, not pixels
        shutil.copytree(
            swapping.repository / "tabular" / "1",
            swapped,
            ignore=shutil.ignore_patterns("stats.json"),
        )

    refused, answer = refused_load(swapping, tabular)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.details() == (
        "model 'digits' version 2 refused: pipeline 'digits': its steps and rules were checked "
        "at start against model 'digits' version 2, and model 'digits' version 2 (loaded now) "
        "has input 'features', which model 'digits' version 2 has not; a version loaded later "
        "must take and give what they were checked against (restart preprocess and "
        "postprocess to check them against another); version 2 keeps serving"
    )
    assert answer.model_version == "2" and answer.outputs[0].name == "logits"


def test_a_hot_swapped_version_of_another_input_size_is_refused(swapping: Swapping) -> None:
    """Same name, datatype and rank; 32 pixels where the pipeline's flatten step makes 64."""

    def smaller(swapped: Path) -> None:
        rng = np.random.default_rng(0)
        layer = (rng.normal(size=(32, 10)).astype(np.float32), np.zeros(10, np.float32))
        swapped.mkdir()
        onnx.save(dense_model([layer], "pixels", "logits"), swapped / "model.onnx")

    refused, answer = refused_load(swapping, smaller)
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert (
        "pipeline 'digits': its steps and rules were checked at start against model 'digits' "
        "version 2, and model 'digits' version 2 (loaded now) takes input 'pixels' as "
        "[-1, 32], but preprocess step 'flatten' gives it as [-1, 64]"
    ) in refused.details()
    assert refused.details().endswith("version 2 keeps serving")
    assert answer.model_version == "2" and answer.outputs[0].name == "logits"
