"""The issue's findings, one case each at every port they reach.

A few bytes declaring a huge, odd or empty-but-huge shape are refused at once with a client's
error, however many arrive together, while a good request to the same port keeps its normal
latency (the 60-byte BYTES [64000000] request used to hold the gateway's event loop for
seconds). Model versions that are digits to `str.isdigit` but not to `int()`, and names of
5,000 characters, get a client's answer on every call that names a model. Finite but huge
tabular features and NaN or infinite logits never come back OK with NaN scores.
"""

from __future__ import annotations

import numpy as np
import pytest

from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.hostile import (
    CLIENT,
    CONTROL,
    FINDINGS,
    LONG_NAME,
    ODD_VERSIONS,
    REFUSED,
    Finding,
    S,
    answer,
    burst,
    finite,
    item_outcomes,
)
from tests.support.ports import INPUTS, good_item, kind, named, ports, stub_for, watched
from tests.support.results import raise_for_result

# Every attack is judged by how late an honest request meanwhile is: run alone.
pytestmark = pytest.mark.timing

READS = {
    "gateway": ["ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig"],
    "inference": ["ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"],
}
CHANGES = ["RepositoryModelLoad", "RepositoryModelUnload"]


def by_label(finding: Finding) -> str:
    return finding.label


@pytest.mark.parametrize("finding", FINDINGS, ids=by_label)
@pytest.mark.parametrize("port", ports("gateway", "inference"))
def test_a_huge_declared_shape_is_refused_at_once(
    system: Supervisor, channels: dict, port: str, finding: Finding
) -> None:
    stub = stub_for(channels[port], port)
    request = finding.request(finding.pipeline, INPUTS[kind(port)][finding.pipeline])
    with watched(system, channels[port], port):
        burst(stub.ModelInfer, request, allowed=REFUSED)


@pytest.mark.parametrize("finding", FINDINGS, ids=by_label)
@pytest.mark.parametrize("port", ports("preprocess", "postprocess"))
def test_a_huge_declared_shape_in_a_process_item_fails_that_item_alone(
    system: Supervisor, channels: dict, port: str, finding: Finding
) -> None:
    stub = stub_for(channels[port], port)
    good = good_item(port)
    (alone,) = stub.Process(v1.ProcessRequest(requests=[good]), timeout=15).results
    hostile = v1.Request(
        id="hostile",
        pipeline=finding.pipeline,
        tensors=[finding.tensor(INPUTS[kind(port)][finding.pipeline])],
    )
    request = v1.ProcessRequest(requests=[hostile, good])
    with watched(system, channels[port], port):
        replies = burst(stub.Process, request, allowed={S.OK})
    for reply, _ in replies:
        (refused,), (ok,) = item_outcomes(request, reply)
        assert refused in REFUSED and ok == S.OK, (refused, ok)
        assert reply.results[1] == alone


def odd_calls(port: str) -> list[tuple[str, str, str, str]]:
    """(case id, method, model name, version) for every call at `port` that names a model:
    a real model at an odd version, and a name of 5,000 characters (load and unload too)."""
    versions = {"superscript-2": ODD_VERSIONS[0], "5000-digits": ODD_VERSIONS[1]}
    reads = READS[kind(port)]
    odd = [(f"{m}-{v}", m, "digits", version) for m in reads for v, version in versions.items()]
    changes = CHANGES if kind(port) == "inference" else []
    return odd + [(f"{m}-long-name", m, LONG_NAME, "") for m in reads + changes]


ODD = {
    f"{port}-{case}": (port, method, name, version)
    for port in ports("gateway", "inference")
    for case, method, name, version in odd_calls(port)
}


@pytest.mark.parametrize(("port", "method", "name", "version"), ODD.values(), ids=ODD)
def test_an_odd_model_name_or_version_gets_a_clients_answer(
    channels: dict, port: str, method: str, name: str, version: str
) -> None:
    stub = stub_for(channels[port], port)
    codes = CONTROL if method in CHANGES else CLIENT
    request = named(method, name, version)
    reply, code = answer(lambda: getattr(stub, method)(request, timeout=15), codes)
    if method == "ModelReady":
        assert reply is None or not reply.ready, "no such model or version is ready"
    elif method != "ModelStatistics":
        assert code != S.OK, "no such model or version to answer for"


HUGE_FEATURES = {
    "all-3.4e38": np.full((1, 30), 3.4e38, np.float32),
    "all--3.4e38": np.full((1, 30), -3.4e38, np.float32),
    "one-3.4e38": np.where(np.arange(30) == 3, 3.4e38, 1.0).astype(np.float32)[None],
    "max-float32": np.full((2, 30), np.finfo(np.float32).max, np.float32),
}


@pytest.mark.parametrize("features", HUGE_FEATURES.values(), ids=HUGE_FEATURES)
def test_huge_finite_features_never_get_nan_scores(channels: dict, features: np.ndarray) -> None:
    stub = stub_for(channels["gateway"], "gateway")
    request = codec.build_request("tabular", {"features": features})
    reply, _ = answer(lambda: stub.ModelInfer(request, timeout=15))
    assert reply is None or finite(codec.response_outputs(reply)), "OK with NaN scores"


BAD_LOGITS = {"nan": np.nan, "inf": np.inf, "-inf": -np.inf}


@pytest.mark.parametrize("pipeline", ["digits", "tabular"])
@pytest.mark.parametrize("value", BAD_LOGITS.values(), ids=BAD_LOGITS)
@pytest.mark.parametrize("where", ["all", "one"])
def test_nan_or_infinite_logits_never_get_nan_scores(
    channels: dict, pipeline: str, value: float, where: str
) -> None:
    stub = stub_for(channels["postprocess"], "postprocess")
    logits = np.zeros((1, 10 if pipeline == "digits" else 2), np.float32)
    logits[0, : None if where == "all" else 1] = value
    item = v1.Request(id="x", pipeline=pipeline, tensors=[codec.to_tensor("logits", logits)])
    request = v1.ProcessRequest(requests=[item])
    reply, _ = answer(lambda: stub.Process(request, timeout=15), {S.OK})
    ((code,),) = item_outcomes(request, reply)
    assert code != S.OK or finite(raise_for_result(reply.results[0])), "OK with NaN scores"
