"""Property-based fuzzing of the running system through the gateway (hypothesis).

Valid and broken v2 requests — every datatype, shape and byte-size mismatches, negative and
huge dimensions, NaN and infinities, invalid UTF-8, mixed raw and typed contents, unknown
inputs, outputs and models, oversized messages, random parameters. Every answer must be OK or
a documented error code, never INTERNAL, never a hang, and every process must stay up.
`make test` runs a short profile; `make fuzz` (HYPOTHESIS_PROFILE=long) a long one. The
strategies are shared with tests/hostile, which sends hostile input to every port.
"""

import grpc
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.hostile import CLIENT, MAX_MESSAGE, answer, finite, v2_requests


@pytest.fixture(scope="module")
def stub(system: Supervisor) -> v2_grpc.GRPCInferenceServiceStub:
    options = [("grpc.max_send_message_length", 8 * MAX_MESSAGE)]
    return v2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(system.address("gateway"), options=options)
    )


def outcome(stub, request: v2.ModelInferRequest) -> grpc.StatusCode:
    return answer(lambda: stub.ModelInfer(request, timeout=15))[1]


GATEWAY_REQUESTS = v2_requests(["digits", "tabular", "nope", ""], ["images", "features", "text"])


@given(request=GATEWAY_REQUESTS)
def test_broken_requests_get_documented_errors(system, stub, request) -> None:
    outcome(stub, request)
    assert system.failed() is None


@given(
    height=st.integers(1, 64),
    width=st.integers(1, 64),
    batch=st.integers(1, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_valid_digit_images_of_any_size_are_answered(stub, height, width, batch, seed) -> None:
    images = np.random.default_rng(seed).integers(0, 256, (batch, height, width), dtype=np.uint8)
    assert outcome(stub, codec.build_request("digits", {"images": images})) == grpc.StatusCode.OK


@given(
    values=st.lists(st.floats(width=32), min_size=30, max_size=30),
    rows=st.integers(1, 4),
)
def test_tabular_features_with_nan_and_infinities(stub, values, rows) -> None:
    features = np.tile(np.array(values, dtype=np.float32), (rows, 1))
    request = codec.build_request("tabular", {"features": features})
    reply, code = answer(lambda: stub.ModelInfer(request, timeout=15))
    if not np.isfinite(features).all():
        assert code == grpc.StatusCode.INVALID_ARGUMENT
    elif np.abs(features).max() <= 1e6:  # measurements; beyond, refusing them is fine too
        assert code == grpc.StatusCode.OK
    if reply is not None:
        assert finite(codec.response_outputs(reply)), "an OK answer with NaN or infinite scores"


@given(text=st.binary(max_size=64))
def test_bytes_in_a_numeric_pipeline_and_oversized_messages(stub, text) -> None:
    strings = np.array([text], dtype=object)
    assert outcome(stub, codec.build_request("digits", {"images": strings})) in CLIENT
    huge = np.zeros((1, 1100, 1000), np.uint8)  # above the 1 MiB message limit
    assert outcome(stub, codec.build_request("digits", {"images": huge})) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
