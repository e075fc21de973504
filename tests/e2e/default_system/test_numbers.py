"""Numbers stay numbers, with real processes: a finite input never comes back OK with NaN
or infinity; out-of-range values are refused at the door, and every layer behind it refuses
what would overflow or is not a number, naming it."""

import grpc
import numpy as np
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec

HUGE = np.full((1, 30), 3.4e38, np.float32)  # finite, and far past any standardising


def refused(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def process(stub, pipeline: str, arrays: dict) -> v1.Result:
    item = v1.Request(id="r", pipeline=pipeline, tensors=codec.arrays_to_tensors(arrays))
    return stub.Process(v1.ProcessRequest(requests=[item]), timeout=10).results[0]


def test_values_outside_the_declared_range_are_refused_at_the_gateway(system) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    error = refused(lambda: stub.ModelInfer(codec.build_request("tabular", {"features": HUGE})))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "outside its declared range" in error.details()
    ok = stub.ModelInfer(codec.build_request("tabular", {"features": np.ones((1, 30), "f4")}))
    assert np.isfinite(codec.response_outputs(ok)["score"]).all()


def test_preprocess_checks_the_range_too_when_called_directly(system) -> None:
    # (Past the range, standardising refuses what would overflow: test_steps_numeric.)
    stub = preprocess_pb2_grpc.PreprocessStub(grpc.insecure_channel(system.address("preprocess-0")))
    result = process(stub, "tabular", {"features": HUGE})
    assert result.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "outside its declared range" in result.error.message


def test_postprocess_refuses_nan_logits_instead_of_answering_nan_scores(system) -> None:
    channel = grpc.insecure_channel(system.address("postprocess"))
    stub = postprocess_pb2_grpc.PostprocessStub(channel)
    result = process(stub, "digits", {"logits": np.array([[np.nan] + [0.0] * 9], np.float32)})
    assert result.error.code == grpc.StatusCode.FAILED_PRECONDITION.value[0]
    assert "'logits' are NaN or infinite" in result.error.message
