"""A hostile client on every port of the running system: declarations that would take
gigabytes, ranks and dimensions no array can take, malformed model names and versions. Each
is refused at once with INVALID_ARGUMENT (or NOT_FOUND for a well-formed unknown name) and a
message naming the field and the limit, never INTERNAL or UNKNOWN; refusing them holds up
no one else, and every process stays up."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import ROOT, running_system

# (datatype, shape, data, words the refusal must say besides the tensor's name)
SHAPES = [
    pytest.param("BYTES", [64_000_000], bytes(60), ["64000000", "limit"], id="64M"),
    pytest.param("BYTES", [1 << 40], b"", ["1099511627776", "limit"], id="2^40"),
    pytest.param("BYTES", [2**62, 4], b"", [str(2**62), "limit"], id="2^62x4"),
    pytest.param("BYTES", [2**63 - 1], b"", [str(2**63 - 1), "limit"], id="2^63-1"),
    pytest.param("UINT8", [1] * 70, bytes(1), ["rank 70", "limit of 8"], id="rank70"),
    pytest.param("UINT8", [2**62, 0, 2**62], b"", [str(2**62), "limit"], id="empty3"),
    pytest.param("FP32", [2**62, 0], b"", [str(2**62), "limit"], id="empty2"),
]
STUBS = {
    "preprocess-0": preprocess_pb2_grpc.PreprocessStub,
    "postprocess": postprocess_pb2_grpc.PostprocessStub,
}
HUGE_NAME = "d" * 5000
# Loads and unloads may be off, or ask for the admin token first; never INTERNAL.
GATED = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNIMPLEMENTED,
}
BAD_VERSIONS = ["\u00b2", "9" * 5000]


def hostile(
    model: str, name: str, datatype: str, shape: list[int], data: bytes
) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name=model)
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


def refusal(call: Callable[[], object]) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def assert_refused(error: grpc.RpcError, code: grpc.StatusCode, words: list[str]) -> None:
    assert error.code() == code, f"{error.code().name}: {error.details()}"
    for word in words:
        assert word in error.details(), error.details()
    assert len(error.details()) < 400


def v2_stub(address: str) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(address))


@pytest.fixture(scope="module")
def inference(system: Supervisor) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_stub(system.address("inference-a"))


@pytest.fixture(autouse=True, scope="module")
def everyone_stays_up(system: Supervisor):
    yield
    assert system.failed() is None


@pytest.mark.parametrize(("datatype", "shape", "data", "words"), SHAPES)
@pytest.mark.parametrize(("model", "name"), [("digits", "images"), ("tabular", "features")])
def test_the_gateway_refuses_hostile_shapes(
    gateway: str, model: str, name: str, datatype: str, shape: list, data: bytes, words: list
) -> None:
    request = hostile(model, name, datatype, shape, data)
    error = refusal(lambda: v2_stub(gateway).ModelInfer(request, timeout=10))
    assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, [f"'{name}'", *words])


@pytest.mark.parametrize(("datatype", "shape", "data", "words"), SHAPES)
def test_an_inference_port_refuses_hostile_shapes(
    inference, datatype: str, shape: list, data: bytes, words: list
) -> None:
    request = hostile("digits", "pixels", datatype, shape, data)
    error = refusal(lambda: inference.ModelInfer(request, timeout=10))
    assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, ["'pixels'", *words])


@pytest.mark.parametrize("layer", list(STUBS))
@pytest.mark.parametrize(("datatype", "shape", "data", "words"), SHAPES)
def test_a_process_item_with_a_hostile_tensor_fails_alone(
    system: Supervisor, layer: str, datatype: str, shape: list, data: bytes, words: list
) -> None:
    stub = STUBS[layer](grpc.insecure_channel(system.address(layer)))
    tensor = v1.Tensor(name="images", datatype=datatype, shape=shape, data=data)
    flight = v1.Request(id="f", pipeline="digits", tensors=[tensor])
    flight.members.add(id="m1", rows=1)
    flight.members.add(id="m2", rows=1)
    plain = v1.Request(id="r", pipeline="digits", tensors=[tensor])
    reply = stub.Process(v1.ProcessRequest(requests=[plain, flight]), timeout=10)
    alone, flown = reply.results
    for error in [alone.error, *(member.error for member in flown.members)]:
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0], error.message
        assert all(word in error.message for word in ["'images'", *words]), error.message


@pytest.mark.parametrize("version", BAD_VERSIONS, ids=["superscript", "5000-digits"])
def test_malformed_versions_on_an_inference_port(inference, version: str) -> None:
    assert not inference.ModelReady(v2.ModelReadyRequest(name="digits", version=version)).ready
    words = ["model version", "1 to 18 digits"]
    calls = [
        lambda: inference.ModelMetadata(v2.ModelMetadataRequest(name="digits", version=version)),
        lambda: inference.ModelConfig(v2.ModelConfigRequest(name="digits", version=version)),
        lambda: inference.ModelStatistics(
            v2.ModelStatisticsRequest(name="digits", version=version)
        ),
        lambda: inference.ModelInfer(
            codec.build_request("digits", {"pixels": np.zeros((1, 64), "f4")}, version)
        ),
    ]
    for call in calls:
        assert_refused(refusal(call), grpc.StatusCode.INVALID_ARGUMENT, words)


def test_a_huge_model_name_on_an_inference_port(inference) -> None:
    assert not inference.ModelReady(v2.ModelReadyRequest(name=HUGE_NAME)).ready
    words = ["model name", "5000 characters", "limit of 255"]
    calls = [
        lambda: inference.ModelMetadata(v2.ModelMetadataRequest(name=HUGE_NAME)),
        lambda: inference.ModelStatistics(v2.ModelStatisticsRequest(name=HUGE_NAME)),
        lambda: inference.ModelInfer(
            codec.build_request(HUGE_NAME, {"pixels": np.zeros((1, 64), "f4")})
        ),
    ]
    for call in calls:
        assert_refused(refusal(call), grpc.StatusCode.INVALID_ARGUMENT, words)
    repository = [
        lambda: inference.RepositoryModelLoad(v2.RepositoryModelLoadRequest(model_name=HUGE_NAME)),
        lambda: inference.RepositoryModelUnload(
            v2.RepositoryModelUnloadRequest(model_name=HUGE_NAME)
        ),
    ]
    for call in repository:
        error = refusal(call)
        if error.code() not in GATED:
            assert_refused(error, grpc.StatusCode.INVALID_ARGUMENT, words)


def test_well_formed_unknown_names_and_versions_are_not_found(inference) -> None:
    assert not inference.ModelReady(v2.ModelReadyRequest(name="ghost")).ready
    calls = {
        "'ghost'": lambda: inference.ModelMetadata(v2.ModelMetadataRequest(name="ghost")),
        "'7'": lambda: inference.ModelMetadata(v2.ModelMetadataRequest(name="digits", version="7")),
        "'g": lambda: inference.ModelStatistics(v2.ModelStatisticsRequest(name="g" * 255)),
    }
    for word, call in calls.items():
        assert_refused(refusal(call), grpc.StatusCode.NOT_FOUND, [word])
    error = refusal(
        lambda: inference.RepositoryModelUnload(v2.RepositoryModelUnloadRequest(model_name="ghost"))
    )
    if error.code() not in GATED:
        assert_refused(error, grpc.StatusCode.NOT_FOUND, ["'ghost'"])


@pytest.mark.parametrize("port", ["gateway", "inference-a"])
def test_huge_declarations_hold_up_no_one(system: Supervisor, port: str) -> None:
    stub = v2_stub(system.address(port))
    model, name = ("digits", "images") if port == "gateway" else ("digits", "pixels")
    good = codec.build_request(
        model, {name: np.zeros((1, 8, 8), "u1") if port == "gateway" else np.zeros((1, 64), "f4")}
    )
    stub.ModelInfer(good, timeout=10)  # warm: the channel and the chain
    bad = hostile(model, name, "BYTES", [64_000_000], bytes(60))
    with ThreadPoolExecutor(5) as pool:
        refused = [pool.submit(refusal, lambda: stub.ModelInfer(bad, timeout=10)) for _ in range(4)]
        start = time.perf_counter()
        stub.ModelInfer(good, timeout=10)
        took = time.perf_counter() - start
        codes = {future.result().code() for future in refused}
    assert codes == {grpc.StatusCode.INVALID_ARGUMENT}
    # Four such requests used to hold the gateway's loop for about 5 s; a good request takes
    # milliseconds, and well under the bound at a load average of 8.
    assert took < 2.5


def fail_when_bright(path: Path) -> None:
    """Rewrite a digits model so that it fails while running (asking ONNX Runtime for
    terabytes) on any image brighter than 0.9, the way a model runs out of memory: it still
    loads, warms up on zeros and answers darker images."""
    model = onnx.load(path)
    graph, out, pixels = model.graph, model.graph.output[0].name, model.graph.input[0].name
    for node in graph.node:
        node.output[:] = [f"{out}.raw" if name == out else name for name in node.output]
    graph.initializer.extend(
        [
            numpy_helper.from_array(np.array(0.9, np.float32), "bright"),
            numpy_helper.from_array(np.array(1e14, np.float32), "scale"),
            numpy_helper.from_array(np.array([1], np.int64), "one"),
        ]
    )
    graph.node.extend(
        [
            helper.make_node("ReduceMax", [pixels], ["top"], keepdims=0),
            helper.make_node("Sub", ["top", "bright"], ["over"]),
            helper.make_node("Relu", ["over"], ["excess"]),
            helper.make_node("Mul", ["excess", "scale"], ["wanted"]),
            helper.make_node("Cast", ["wanted"], ["count"], to=TensorProto.INT64),
            helper.make_node("Reshape", ["count", "one"], ["size"]),
            helper.make_node("ConstantOfShape", ["size"], ["zeros"]),
            helper.make_node("ReduceSum", ["zeros"], ["nothing"], keepdims=0),
            helper.make_node("Add", [f"{out}.raw", "nothing"], [out]),
        ]
    )
    onnx.save(model, path)


def test_a_model_failing_while_it_runs_fails_over_and_opens_its_circuit(tmp_path: Path) -> None:
    repository = tmp_path / "repository"
    shutil.copytree(ROOT / "build" / "repository", repository)
    fail_when_bright(repository / "digits" / "2" / "model.onnx")
    shutil.rmtree(repository / "digits" / "2" / "validation")  # its cases would fail it
    routes = [
        {"arm": "control", "deployment": "a", "version": "1", "weight": 50},
        {"arm": "canary", "deployment": "b", "version": "2", "weight": 50},
    ]
    changes = {
        "repository": str(repository),
        "gateway": {"breaker": {"failures": 3, "open_seconds": 60}},
        "pipelines": {"digits": {"model": {"name": "digits", "routes": routes}}},
    }
    with running_system(tmp_path, changes) as system:
        gateway = v2_stub(system.address("gateway"))
        canary = v2_stub(system.address("inference-b"))

        bad = hostile("digits", "images", "BYTES", [64_000_000], bytes(60))

        def arms(value: int, hostile_too: bool = False) -> list[str]:
            answered = []
            for client in range(16):
                if hostile_too:
                    refusal(lambda: gateway.ModelInfer(bad, timeout=10))
                image = np.full((1, 8, 8), value, np.uint8)
                image[0, 0, client % 8] = client  # no two requests alike
                reply = gateway.ModelInfer(
                    codec.build_request("digits", {"images": image}),
                    metadata=(("x-client-id", f"client-{client}"),),
                    timeout=10,
                )
                answered.append(reply.parameters["strata.arm"].string_param)
            return answered

        def canary_runs() -> tuple[int, int]:
            request = v2.ModelStatisticsRequest(name="digits", version="2")
            stats = canary.ModelStatistics(request).model_stats[0].inference_stats
            return stats.success.count, stats.fail.count

        dim = arms(100, hostile_too=True)  # refused inputs count for nothing
        assert set(dim) == {"control", "canary"} and canary_runs()[1] == 0
        bright = arms(255)  # every canary answer fails over
        assert set(bright) == {"control"}
        assert 3 <= canary_runs()[1] <= 9  # 3 calls opened the circuit (each tried 3 times)
