"""String models answer the text they were given, and models without a batch dimension are
served and described as they are. Built here: an identity model over strings, through
inference directly (unary, stream, flight) and through a gateway pipeline (gRPC and REST);
one that parses strings as numbers (as Triton's simple_string does); a model whose input is
a fixed [3, 4], through inference and through a pipeline of its own shape; and an image of
[3, 4, 4] channels first without a batch dimension (as Triton's densenet_onnx takes), its
pipeline's input declared with `format: NCHW`."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.inprocess import InProcess, servers_in_process
from tests.support.system import ROOT
from tests.unit.inference.test_inference_toymodels import _finish

TEXTS = np.array(["plain", "été ☃", ""], dtype=object)


def echo_model() -> onnx.ModelProto:
    """text STRING [batch] -> same STRING [batch]."""
    graph = helper.make_graph(
        [helper.make_node("Identity", ["text"], ["same"])],
        "echo",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("same", TensorProto.STRING, ["batch"])],
    )
    return _finish(graph)


def parse_model() -> onnx.ModelProto:
    """text STRING [batch] -> number INT32 [batch] by Cast, as Triton's simple_string does
    (ONNX Runtime parses each string: b'12' printed as a string does not parse)."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["text"], ["number"], to=TensorProto.INT32)],
        "parse",
        [helper.make_tensor_value_info("text", TensorProto.STRING, ["batch"])],
        [helper.make_tensor_value_info("number", TensorProto.INT32, ["batch"])],
    )
    return _finish(graph)


def column_sums() -> onnx.ModelProto:
    """x FP32 [3, 4] -> sums FP32 [4]: no batch dimension anywhere."""
    graph = helper.make_graph(
        [helper.make_node("ReduceSum", ["x", "axis"], ["sums"], keepdims=0)],
        "sums",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])],
        [helper.make_tensor_value_info("sums", TensorProto.FLOAT, [4])],
        [onnx.numpy_helper.from_array(np.array([0], np.int64), "axis")],
    )
    return _finish(graph)


def channel_means() -> onnx.ModelProto:
    """images FP32 [3, 4, 4] (channels first, no batch) -> means FP32 [3]."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["images"], ["means"], axes=[1, 2], keepdims=0)],
        "planes",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, [3, 4, 4])],
        [helper.make_tensor_value_info("means", TensorProto.FLOAT, [3])],
    )
    return _finish(graph)


def repository(root: Path) -> Path:
    """The shipped demo models beside the two built here."""
    shipped = ROOT / "build" / "repository"
    for model in ("digits", "tabular", "digits-large"):
        (root / model).symlink_to(shipped / model, target_is_directory=True)
    built = {
        "echo": echo_model(),
        "parse": parse_model(),
        "sums": column_sums(),
        "planes": channel_means(),
    }
    for name, model in built.items():
        (root / name / "1").mkdir(parents=True)
        onnx.save(model, root / name / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    root = repository(tmp_path_factory.mktemp("repository"))
    changes = {
        "repository": str(root),
        "inference": {
            "models": ["digits", "tabular", "digits-large", "echo", "parse", "sums", "planes"]
        },
        "pipelines": {
            "echo": {
                "inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1], "utf8": True}],
                "outputs": [{"name": "same", "datatype": "BYTES", "shape": [-1]}],
                "model": {"name": "echo"},
            },
            "sums": {
                "max_batch_size": 0,
                "inputs": [{"name": "x", "datatype": "FP32", "shape": [3, 4]}],
                "outputs": [{"name": "sums", "datatype": "FP32", "shape": [4]}],
                "model": {"name": "sums"},
            },
            "planes": {
                "max_batch_size": 0,
                "inputs": [
                    {"name": "images", "datatype": "FP32", "shape": [3, 4, 4], "format": "NCHW"}
                ],
                "outputs": [{"name": "means", "datatype": "FP32", "shape": [3]}],
                "model": {"name": "planes"},
            },
        },
    }
    with servers_in_process(tmp_path_factory.mktemp("strings"), changes) as world:
        (rest,) = world.gateway.companions  # the gateway's REST API, beside its gRPC server
        world.run(rest.start())
        try:
            yield world
        finally:
            world.run(rest.stop(0))


@pytest.fixture(scope="module")
def inference(world: InProcess) -> v2_grpc.GRPCInferenceServiceStub:
    (deployment, *_) = world.settings.services.inference.values()
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(deployment.listen))


@pytest.fixture(scope="module")
def gateway(world: InProcess) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(
        grpc.insecure_channel(world.settings.services.gateway.listen)
    )


def texts(response: v2.ModelInferResponse) -> list[str]:
    (array,) = codec.response_outputs(response).values()
    return [item.decode() for item in array.tolist()]


def test_a_string_model_answers_the_text_it_was_given(inference) -> None:
    request = codec.build_request("echo", {"text": TEXTS})
    assert texts(inference.ModelInfer(request, timeout=10)) == list(TEXTS)
    (answer,) = inference.ModelStreamInfer(iter([request]), timeout=10)
    assert texts(answer.infer_response) == list(TEXTS)
    flight = codec.build_request("echo", {"text": TEXTS})
    flight.parameters["strata.rows"].string_param = "2,1"
    assert texts(inference.ModelInfer(flight, timeout=10)) == list(TEXTS)


def test_a_model_that_parses_strings_reads_them_as_text(inference) -> None:
    texts_in = np.array([b"12", b"-3"], dtype=object)
    reply = inference.ModelInfer(codec.build_request("parse", {"text": texts_in}), timeout=10)
    assert codec.response_outputs(reply)["number"].tolist() == [12, -3]


def test_bytes_that_are_not_utf8_are_refused_naming_the_input(inference) -> None:
    request = codec.build_request("echo", {"text": np.array([b"ok", b"\xff"], dtype=object)})
    with pytest.raises(grpc.RpcError) as caught:
        inference.ModelInfer(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "input 'text': element 1 is not valid UTF-8" in caught.value.details()


def test_a_string_pipeline_answers_plain_for_plain_over_grpc_and_rest(world, gateway) -> None:
    request = codec.build_request("echo", {"text": TEXTS})
    assert texts(gateway.ModelInfer(request, timeout=10)) == list(TEXTS)
    body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["plain"]}]}
    rest = world.settings.services.gateway.rest
    call = urllib.request.Request(
        f"http://{rest}/v2/models/echo/infer",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(call, timeout=10) as reply:
        (output,) = json.load(reply)["outputs"]
    assert output["data"] == ["plain"]


def test_a_model_without_a_batch_dimension_is_served_and_described_as_it_is(inference) -> None:
    config = inference.ModelConfig(v2.ModelConfigRequest(name="sums"), timeout=10).config
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [3, 4] and list(config.output[0].dims) == [4]
    metadata = inference.ModelMetadata(v2.ModelMetadataRequest(name="sums"), timeout=10)
    assert list(metadata.inputs[0].shape) == [3, 4] and list(metadata.outputs[0].shape) == [4]
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    reply = inference.ModelInfer(codec.build_request("sums", {"x": x}), timeout=10)
    assert codec.response_outputs(reply)["sums"].tolist() == x.sum(axis=0).tolist()


def test_a_pipeline_without_a_batch_dimension_answers_each_request_alone(gateway) -> None:
    config = gateway.ModelConfig(v2.ModelConfigRequest(name="sums"), timeout=10).config
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [3, 4]

    def ask(i: int) -> bool:
        x = np.full((3, 4), i, np.float32)
        reply = gateway.ModelInfer(codec.build_request("sums", {"x": x}), timeout=10)
        return codec.response_outputs(reply)["sums"].tolist() == [3.0 * i] * 4

    with ThreadPoolExecutor(8) as pool:  # concurrent: none may share another's flight
        assert all(pool.map(ask, range(32)))
    with pytest.raises(grpc.RpcError) as caught:
        ask_wrong = codec.build_request("sums", {"x": np.zeros((1, 3, 4), np.float32)})
        gateway.ModelInfer(ask_wrong, timeout=10)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_a_rank_3_image_without_a_batch_dimension_takes_a_format(gateway) -> None:
    """Triton's densenet_onnx shape: an image client reads FORMAT_NCHW and three dims, and
    sends one image of [3, 4, 4] with no batch dimension."""
    config = gateway.ModelConfig(v2.ModelConfigRequest(name="planes"), timeout=10).config
    (images,) = config.input
    assert config.max_batch_size == 0 and list(images.dims) == [3, 4, 4]
    assert images.format == images.Format.FORMAT_NCHW
    image = np.arange(48, dtype=np.float32).reshape(3, 4, 4)
    reply = gateway.ModelInfer(codec.build_request("planes", {"images": image}), timeout=10)
    assert codec.response_outputs(reply)["means"].tolist() == image.mean(axis=(1, 2)).tolist()
