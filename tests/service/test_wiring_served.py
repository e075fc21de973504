"""A pipeline whose answer is unlike what it declares, which only a request can show: the
client gets FAILED_PRECONDITION naming the output (the server's fault, never
INVALID_ARGUMENT), and the pipeline reports not ready until it answers again."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.inprocess import servers_in_process

DIGITS = {
    "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [-1, 64]}],
    "outputs": [{"name": "logits", "datatype": "FP32", "shape": [-1, 10]}],
    "model": {"name": "digits", "routes": [{"arm": "a", "deployment": "a", "version": "1"}]},
}
SHRINK = {"kind": "tests.support.plugins:Shrink", "input": "logits", "when": {"parameter": "cut"}}


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[v2_grpc.GRPCInferenceServiceStub]:
    pipelines = {"pipelines": {"plain": DIGITS, "shrunk": {**DIGITS, "postprocess": [SHRINK]}}}
    with servers_in_process(tmp_path_factory.mktemp("wiring"), pipelines) as world:
        channel = grpc.insecure_channel(world.settings.services.gateway.listen)
        yield v2_grpc.GRPCInferenceServiceStub(channel)


def infer(gateway: v2_grpc.GRPCInferenceServiceStub, cut: bool) -> v2.ModelInferResponse:
    request = codec.build_request("shrunk", {"pixels": np.zeros((1, 64), np.float32)})
    if cut:
        request.parameters["cut"].string_param = "yes"
    return gateway.ModelInfer(request, timeout=30)


def ready(gateway: v2_grpc.GRPCInferenceServiceStub, name: str) -> bool:
    return gateway.ModelReady(v2.ModelReadyRequest(name=name), timeout=10).ready


def test_an_answer_unlike_its_declaration_is_a_server_fault_and_not_ready(
    gateway: v2_grpc.GRPCInferenceServiceStub,
) -> None:
    assert ready(gateway, "shrunk") and infer(gateway, cut=False).outputs[0].shape == [1, 10]
    with pytest.raises(grpc.RpcError) as caught:
        infer(gateway, cut=True)
    assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "output 'logits' is FP32 [1, 9], but the pipeline declares FP32 [-1, 10]" in (
        caught.value.details()
    )
    assert not ready(gateway, "shrunk") and ready(gateway, "plain")
    infer(gateway, cut=False)
    assert ready(gateway, "shrunk")
