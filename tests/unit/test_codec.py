"""The tensor codec: every v2 datatype both ways, BYTES encoding, and size checks."""

import grpc
import numpy as np
import pytest

from strata.errors import InvalidArgument, MalformedReply
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec, stack

NUMERIC = [name for name in codec.DTYPES if name != "BYTES"]


def sample(datatype: str) -> np.ndarray:
    dtype = codec.DTYPES[datatype]
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if dtype.kind == "f":
        return np.array([[0.5, -1.25, 3.0], [1e3, -0.0, 7.5]], dtype=dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_raw_round_trip_of_every_numeric_datatype(datatype: str) -> None:
    array = sample(datatype)
    assert codec.datatype_of(array) == datatype
    back = codec.from_raw("x", datatype, array.shape, codec.to_raw(array))
    assert back.dtype == array.dtype and np.array_equal(back, array)


@pytest.mark.parametrize("datatype", [*NUMERIC, "BYTES"])
def test_v2_request_and_v1_tensor_round_trip(datatype: str) -> None:
    array = sample(datatype) if datatype != "BYTES" else np.array([[b"a", b""]], dtype=object)
    request = v2.ModelInferRequest.FromString(
        codec.build_request("m", {"x": array}).SerializeToString()
    )
    assert np.array_equal(codec.request_inputs(request)["x"], array)
    assert np.array_equal(codec.from_tensor(codec.to_tensor("x", array)), array)


@pytest.mark.parametrize("datatype", [d for d in NUMERIC if d != "FP16"])
def test_typed_contents_of_every_datatype(datatype: str) -> None:
    array = sample(datatype)
    request = v2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=array.shape)
    getattr(tensor.contents, codec.CONTENTS_FIELD[datatype]).extend(array.reshape(-1).tolist())
    decoded = codec.request_inputs(request)["x"]
    assert decoded.dtype == array.dtype and np.array_equal(decoded, array)


def test_bytes_with_empty_and_non_ascii_strings() -> None:
    items = ["", "héllo", "日本語", "emoji 🚀", ""]
    array = np.array([s.encode() for s in items], dtype=object).reshape(5, 1)
    raw = codec.to_raw(array)
    assert raw[:4] == b"\x00\x00\x00\x00"
    back = codec.from_raw("s", "BYTES", [5, 1], raw)
    assert [b.decode() for b in back.reshape(-1)] == items
    assert codec.datatype_of(np.array(["abc"])) == "BYTES"


def test_empty_bytes_tensor() -> None:
    empty = np.empty((0, 2), dtype=object)
    assert codec.to_raw(empty) == b""
    assert codec.from_raw("s", "BYTES", [0, 2], b"").shape == (0, 2)


@pytest.mark.parametrize(
    ("datatype", "shape", "raw", "words"),
    [
        ("FP32", [2, 3], b"\x00" * 20, ["needs 24 bytes", "got 20"]),
        ("INT64", [1], b"\x00" * 9, ["needs 8 bytes"]),
        ("UINT8", [-1, 4], b"\x00" * 4, ["negative dimension"]),
        ("BYTES", [2], codec.encode_bytes([b"ab"]), ["needs at least 8 bytes", "got 6"]),
        ("BYTES", [2], codec.encode_bytes([b"abcd"]), ["ends after 1 of 2"]),
        ("BYTES", [1], b"\x05\x00\x00\x00ab", ["runs past"]),
        ("BYTES", [2], codec.encode_bytes([b"abc"]) + b"\x01\x00", ["ends after 1 of 2"]),
        ("BYTES", [2], b"\x01\x00\x00\x00a\x09\x00\x00\x00abc", ["element 1 runs past"]),
        ("BYTES", [1], codec.encode_bytes([b"a", b"b"]), ["left after 1"]),
        ("FP8", [1], b"\x00", ["unknown datatype", "FP8"]),
    ],
)
def test_size_mismatches_are_invalid_argument(datatype, shape, raw, words) -> None:
    with pytest.raises(InvalidArgument) as info:
        codec.from_raw("x", datatype, shape, raw)
    for word in ["'x'", *words]:
        assert word in str(info.value)


def test_typed_contents_errors() -> None:
    request = v2.ModelInferRequest()
    tensor = request.inputs.add(name="x", datatype="INT8", shape=[2])
    tensor.contents.int_contents.extend([1, 300])
    with pytest.raises(InvalidArgument, match="out of range for INT8"):
        codec.request_inputs(request)
    del tensor.contents.int_contents[:]
    tensor.contents.int_contents.append(1)
    with pytest.raises(InvalidArgument, match="needs 2 values, got 1"):
        codec.request_inputs(request)
    half = v2.ModelInferRequest()
    half.inputs.add(name="h", datatype="FP16", shape=[1]).contents.fp32_contents.append(1)
    with pytest.raises(InvalidArgument, match="FP16 must be sent in raw_input_contents"):
        codec.request_inputs(half)


def test_mixing_raw_and_typed_inputs_is_refused() -> None:
    request = codec.build_request("m", {"a": np.zeros(2, np.float32)})
    request.inputs.add(name="b", datatype="FP32", shape=[1]).contents.fp32_contents.append(1)
    with pytest.raises(InvalidArgument, match="1 entries for 2 tensors"):
        codec.request_inputs(request)
    request.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(InvalidArgument, match="both typed contents and raw"):
        codec.request_inputs(request)


def test_duplicate_inputs_are_refused() -> None:
    request = codec.build_request("m", {"a": np.zeros(1, np.float32)})
    request.inputs.add(name="a", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\x00" * 4)
    with pytest.raises(InvalidArgument, match="more than once"):
        codec.request_inputs(request)


def test_requested_outputs() -> None:
    request = v2.ModelInferRequest(model_name="m")
    assert codec.requested_outputs(request, ["a", "b"]) == ["a", "b"]
    request.outputs.add(name="b")
    assert codec.requested_outputs(request, ["a", "b"]) == ["b"]
    request.outputs.add(name="zz")
    with pytest.raises(InvalidArgument, match="no output 'zz'"):
        codec.requested_outputs(request, ["a", "b"])


def _response(outputs: dict[str, np.ndarray]) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name="m")
    codec.add_outputs(response, outputs)
    return response


def test_response_tensors_pass_raw_outputs_on_as_they_are() -> None:
    logits = np.arange(20, dtype=np.float32).reshape(2, 10)
    (tensor,) = codec.response_tensors(_response({"logits": logits}), "deployment 'a'")
    assert (tensor.name, tensor.datatype, list(tensor.shape)) == ("logits", "FP32", [2, 10])
    np.testing.assert_array_equal(codec.from_tensor(tensor), logits)


def _truncated(response: v2.ModelInferResponse) -> None:
    response.raw_output_contents[0] = response.raw_output_contents[0][:8]


def _raw_dropped(response: v2.ModelInferResponse) -> None:
    del response.raw_output_contents[:]
    response.raw_output_contents.append(b"\0" * 8)


def _extra_output(response: v2.ModelInferResponse) -> None:
    response.outputs.add(name="more", datatype="FP32", shape=[1])


def _unknown_datatype(response: v2.ModelInferResponse) -> None:
    response.outputs[0].datatype = "FP128"


@pytest.mark.parametrize(
    ("break_it", "says"),
    [
        (_truncated, "8 bytes for FP32 [2, 10], which holds 80"),
        (_raw_dropped, "8 bytes for FP32 [2, 10]"),
        (_extra_output, "raw contents has 1 entries for 2 tensors"),
        (_unknown_datatype, "unknown datatype"),
    ],
)
def test_a_malformed_response_is_the_servers_fault_not_the_callers(break_it, says) -> None:
    response = _response({"logits": np.zeros((2, 10), np.float32)})
    break_it(response)
    with pytest.raises(MalformedReply) as caught:
        codec.response_tensors(response, "inference deployment 'a'")
    assert caught.value.code == grpc.StatusCode.INTERNAL
    message = str(caught.value)
    assert message.startswith("inference deployment 'a' answered a malformed reply: ")
    assert says in message


def test_a_fixed_width_tensor_is_sized_by_its_shape_without_reading_its_data() -> None:
    def unread() -> bytes:
        raise AssertionError("a fixed-width tensor's data was read to size it")

    assert stack.size("FP32", [2, 3, 224, 224], unread) == 2 * 3 * 224 * 224 * 4
    strings = codec.to_raw(np.array([b"a", b"bcd"], dtype=object))
    assert stack.size("BYTES", [2], lambda: strings) == len(strings) == 4 + 1 + 4 + 3
    tensor = codec.to_tensor("x", np.zeros((5, 7), np.int16))
    assert stack.tensor_size(tensor) == len(tensor.data) == 70


def test_a_requests_inputs_come_decoded_and_as_they_came() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    text = np.array([[b"ab"], [b"c"]], dtype=object)
    arrays, raw = codec.client_inputs(codec.build_request("m", {"x": x, "s": text}))
    np.testing.assert_array_equal(arrays["x"], x)
    assert arrays["s"].tolist() == text.tolist()
    assert [(r.name, r.datatype, r.shape) for r in raw] == [
        ("x", "FP32", (2, 3)),
        ("s", "BYTES", (2, 1)),
    ]
    assert raw[0].data == x.tobytes() and raw[1].data == codec.to_raw(text)
    typed = v2.ModelInferRequest(model_name="m")
    tensor = typed.inputs.add(name="n", datatype="INT32", shape=[2])
    tensor.contents.int_contents.extend([7, 8])
    arrays, raw = codec.client_inputs(typed)
    assert arrays["n"].tolist() == [7, 8] and raw[0].data == np.array([7, 8], "<i4").tobytes()
