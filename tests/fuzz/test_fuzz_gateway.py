"""Property-based fuzzing of the running system through the gateway (hypothesis).

Valid and broken v2 requests — every datatype, shape and byte-size mismatches, negative and
huge dimensions, NaN and infinities, invalid UTF-8, mixed raw and typed contents, unknown
inputs, outputs and models, oversized messages, random parameters. Every answer must be OK or
a documented error code, never INTERNAL, never a hang, and every process must stay up.
`make test` runs a short profile; `make fuzz` (HYPOTHESIS_PROFILE=long) a long one.
"""

import os
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from strata import codec
from strata.launch import Supervisor
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.system import running_system

settings.register_profile(
    "short", max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "long", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "short"))

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.FAILED_PRECONDITION,
}
DATATYPES = [*codec.DTYPES, "FP8", "", "fp32", "STRING"]
MAX_MESSAGE = 1 << 20


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {"server": {"max_message_bytes": MAX_MESSAGE}}
    with running_system(tmp_path_factory.mktemp("fuzz"), changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def stub(system: Supervisor) -> v2_grpc.GRPCInferenceServiceStub:
    options = [("grpc.max_send_message_length", 8 * MAX_MESSAGE)]
    return v2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(system.address("gateway"), options=options)
    )


def outcome(stub, request: v2.ModelInferRequest) -> grpc.StatusCode:
    try:
        stub.ModelInfer(request, timeout=15)
    except grpc.RpcError as exc:
        assert exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED, "the system hung"
        assert exc.code() in DOCUMENTED, f"{exc.code().name}: {exc.details()}"
        assert exc.details(), "every error says what was wrong"
        return exc.code()
    return grpc.StatusCode.OK


dims = st.one_of(st.integers(-3, 70), st.sampled_from([0, 1 << 20, 1 << 40, -(1 << 40)]))
names = st.one_of(st.sampled_from(["images", "features", "text"]), st.text(max_size=8))
parameter = st.one_of(
    st.builds(v2.InferParameter, bool_param=st.booleans()),
    st.builds(v2.InferParameter, int64_param=st.integers(-(1 << 63), (1 << 63) - 1)),
    st.builds(v2.InferParameter, string_param=st.text(max_size=20)),
    st.builds(v2.InferParameter, double_param=st.floats(allow_nan=True)),
)


@st.composite
def broken_requests(draw) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(
        model_name=draw(st.sampled_from(["digits", "tabular", "nope", ""])),
        model_version=draw(st.sampled_from(["", "1", "7", "x"])),
    )
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 3))):
        tensor = request.inputs.add(
            name=draw(names),
            datatype=draw(st.sampled_from(DATATYPES)),
            shape=draw(st.lists(dims, max_size=4)),
        )
        if raw:
            request.raw_input_contents.append(draw(st.binary(max_size=2048)))
        else:
            tensor.contents.int_contents.extend(
                draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=64))
            )
            tensor.contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=64)))
            tensor.contents.bytes_contents.extend(
                draw(st.lists(st.binary(max_size=16), max_size=8))
            )
    if draw(st.booleans()) and request.inputs:
        request.raw_input_contents.append(draw(st.binary(max_size=64)))  # mixed or extra
    for key in draw(st.lists(st.text(max_size=10), max_size=3)):
        request.parameters[key].CopyFrom(draw(parameter))
    for output in draw(st.lists(names, max_size=2)):
        request.outputs.add(name=output)
    return request


@given(request=broken_requests())
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
    code = outcome(stub, codec.build_request("tabular", {"features": features}))
    finite = bool(np.isfinite(features).all())
    assert code == (grpc.StatusCode.OK if finite else grpc.StatusCode.INVALID_ARGUMENT)


@given(text=st.binary(max_size=64))
def test_bytes_in_a_numeric_pipeline_and_oversized_messages(stub, text) -> None:
    strings = np.array([text], dtype=object)
    assert outcome(stub, codec.build_request("digits", {"images": strings})) in DOCUMENTED
    huge = np.zeros((1, 1100, 1000), np.uint8)  # above the 1 MiB message limit
    assert outcome(stub, codec.build_request("digits", {"images": huge})) == (
        grpc.StatusCode.RESOURCE_EXHAUSTED
    )
