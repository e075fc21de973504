"""What the load tool sends: ghz-style JSON messages, binary messages, rows of arrays."""

import json
from pathlib import Path

import numpy as np
import pytest

from bench.load.data import from_arrays, from_binary, from_json, json_bodies, method
from bench.load.options import UsageError
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

REQUEST = v2.ModelInferRequest


def test_json_messages_use_protobuf_field_names_and_lists_are_sent_in_turn() -> None:
    text = (
        '[{"model_name": "tabular", "inputs": [{"name": "features", "datatype": "FP32",'
        ' "shape": [1, 2], "contents": {"fp32_contents": [1.5, 2]}}]}, {"modelName": "x"}]'
    )
    first, second = (REQUEST.FromString(m) for m in from_json(REQUEST, text, "-d"))
    assert first.model_name == "tabular"
    assert list(first.inputs[0].contents.fp32_contents) == [1.5, 2.0]
    assert second.model_name == "x"


@pytest.mark.parametrize(
    ("text", "message"),
    [("{", "not JSON"), ('{"nope": 1}', "not a inference.ModelInferRequest"), ("[]", "empty")],
)
def test_bad_json_data_is_refused_saying_why(text: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        from_json(REQUEST, text, "-d")


def test_binary_messages_are_checked_before_they_are_sent(tmp_path: Path) -> None:
    good, bad = tmp_path / "good.bin", tmp_path / "bad.bin"
    good.write_bytes(REQUEST(model_name="digits").SerializeToString())
    bad.write_bytes(b"\xff\xff\xff")
    assert REQUEST.FromString(from_binary(REQUEST, good)).model_name == "digits"
    with pytest.raises(UsageError, match="not a serialized"):
        from_binary(REQUEST, bad)


def test_methods_are_the_unary_v2_ones() -> None:
    assert method("/inference.GRPCInferenceService/ModelInfer").name == "ModelInfer"
    with pytest.raises(UsageError, match="has no method 'Infer'"):
        method("/inference.GRPCInferenceService/Infer")
    with pytest.raises(UsageError, match="unknown service"):
        method("/strata.v1.Admin/Status")


def test_rows_become_requests_of_a_batch_each_wrapping_around() -> None:
    images = np.arange(5 * 2 * 2, dtype=np.uint8).reshape(5, 2, 2)
    sent = [REQUEST.FromString(m) for m in from_arrays("digits", {"images": images}, batch=2)]
    assert len(sent) == 3  # rows 0-1, 2-3, 4-0: every row at least once
    last = codec.request_inputs(sent[-1])["images"]
    np.testing.assert_array_equal(last, images[[4, 0]])
    assert list(sent[0].inputs[0].shape) == [2, 2, 2]


def test_request_parameters_ride_along() -> None:
    (message,) = from_arrays(
        "digits", {"images": np.zeros((1, 8, 8), np.uint8)}, parameters={"strata.arm": "canary"}
    )
    assert REQUEST.FromString(message).parameters["strata.arm"].string_param == "canary"


def test_inputs_that_disagree_on_rows_are_refused() -> None:
    arrays = {"a": np.zeros((2, 1), np.float32), "b": np.zeros((3, 1), np.float32)}
    with pytest.raises(UsageError, match="disagree"):
        from_arrays("m", arrays)


def test_http_json_data_is_the_v2_body_itself_and_lists_are_sent_in_turn() -> None:
    text = '[{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": [1.5]}]}, {}]'
    first, second = json_bodies(text, "-d")
    assert json.loads(first)["inputs"][0]["data"] == [1.5] and second == b"{}"
    with pytest.raises(UsageError, match="a v2 request body"):
        json_bodies("[1, 2]", "-d")
