"""REST bodies to v2 messages and back: JSON tensors of every datatype, the binary tensor
extension, parameters and outputs, and every refusal naming what was wrong."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gateway.api.rest import tensors
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec

DATATYPES = list(codec.DTYPES)


def tensor(datatype: str, shape: Any, data: Any, name: str = "x", **fields: Any) -> dict:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data, **fields}


def binary_tensor(datatype: str, shape: Any, size: Any, name: str = "x") -> dict:
    parameters = {"binary_data_size": size}
    return {"name": name, "datatype": datatype, "shape": shape, "parameters": parameters}


def body(*inputs: Any, **fields: Any) -> dict:
    return {"inputs": list(inputs), **fields}


def parsed(document: dict, binary: bytes = b"") -> tensors.Parsed:
    """As the gateway parses it: the document goes over the wire as JSON first."""
    return tensors.to_request(tensors.parse(orjson.dumps(document)), binary, "m", "1")


def refused(document: dict, binary: bytes = b"") -> str:
    with pytest.raises(InvalidArgument) as caught:
        parsed(document, binary)
    return str(caught.value)


def sample(datatype: str) -> list:
    dtype = codec.DTYPES[datatype]
    if datatype == "BOOL":
        return [[True, False, True], [False, False, True]]
    if datatype == "BYTES":
        return [["", "héllo", "日本語"], ["🚀", "a", "b,c"]]
    if dtype.kind == "f":
        return [[0.5, -1.25, 3.0], [1000.0, -0.0, 7.5]]
    info = np.iinfo(dtype)
    return [[int(info.min), 0, int(info.max)], [1, 2, 3]]


def flat(values: list) -> list:
    return [value for row in values for value in row]


@pytest.mark.parametrize("datatype", DATATYPES)
def test_nested_json_data_gives_the_codecs_bytes(datatype: str) -> None:
    values = sample(datatype)
    request = parsed(body(tensor(datatype, [2, 3], values))).request
    expected = codec.to_raw(np.array(values, dtype=codec.DTYPES[datatype]))
    assert list(request.raw_input_contents) == [expected]
    assert request.inputs[0].datatype == datatype and list(request.inputs[0].shape) == [2, 3]


@pytest.mark.parametrize("datatype", DATATYPES)
def test_flat_and_nested_data_give_the_same_bytes(datatype: str) -> None:
    nested = parsed(body(tensor(datatype, [2, 3], sample(datatype)))).request
    flattened = parsed(body(tensor(datatype, [2, 3], flat(sample(datatype))))).request
    assert nested.raw_input_contents == flattened.raw_input_contents


@pytest.mark.parametrize("data", [[0, 2**63 - 1], [2**63], [2**64 - 1]])
def test_uint64_values_numpy_reads_as_integers_are_taken(data: list[int]) -> None:
    request = parsed(body(tensor("UINT64", [len(data)], data))).request
    assert request.raw_input_contents[0] == np.array(data, dtype=np.uint64).tobytes()


@pytest.mark.parametrize("data", [[1, 2**63], [0, 2**64 - 1]])
def test_uint64_values_past_int64_are_taken_among_others(data: list[int]) -> None:
    request = parsed(body(tensor("UINT64", [len(data)], data))).request
    assert request.raw_input_contents[0] == np.array(data, dtype=np.uint64).tobytes()


def test_nested_data_keeps_row_major_order() -> None:
    cube = np.arange(24, dtype=np.int16).reshape(2, 3, 4)
    request = parsed(body(tensor("INT16", [2, 3, 4], cube.tolist()))).request
    decoded = codec.from_raw("x", "INT16", [2, 3, 4], request.raw_input_contents[0])
    assert np.array_equal(decoded, cube)


def test_bytes_strings_are_sent_as_utf8() -> None:
    strings = ["", "héllo", "日本語", "emoji 🚀", '"quoted" [x]']
    request = parsed(body(tensor("BYTES", [5], strings))).request
    decoded = codec.from_raw("x", "BYTES", [5], request.raw_input_contents[0])
    assert [item.decode() for item in decoded] == strings


def test_a_json_request_is_the_message_a_grpc_client_sends() -> None:
    arrays = {
        "images": np.array([[[0, 255], [7, 8]]], dtype=np.uint8),
        "text": np.array([b"one", "twö".encode()], dtype=object),
    }
    document = body(
        tensor("UINT8", [1, 2, 2], arrays["images"].tolist(), name="images"),
        tensor("BYTES", [2], ["one", "twö"], name="text"),
        id="req-7",
    )
    grpc_request = codec.build_request("m", arrays, version="1", request_id="req-7")
    assert parsed(document).request == grpc_request


def test_empty_tensors_carry_no_bytes() -> None:
    request = parsed(body(tensor("FP32", [0, 3], []), tensor("BYTES", [0], [], name="s"))).request
    assert list(request.raw_input_contents) == [b"", b""]


def test_binary_inputs_take_their_bytes_in_order_among_json_ones() -> None:
    first = np.array([1.5, -2.0], dtype=np.float32)
    last = np.array([[1, 2, 3]], dtype=np.uint8)
    document = body(
        binary_tensor("FP32", [2], first.nbytes, name="first"),
        tensor("INT32", [1], [7], name="middle"),
        binary_tensor("UINT8", [1, 3], last.nbytes, name="last"),
        binary_tensor("INT8", [0], 0, name="empty"),
    )
    request = parsed(document, first.tobytes() + last.tobytes()).request
    assert [item.name for item in request.inputs] == ["first", "middle", "last", "empty"]
    assert list(request.raw_input_contents) == [
        first.tobytes(),
        codec.to_raw(np.array([7], dtype=np.int32)),
        last.tobytes(),
        b"",
    ]
    decoded = codec.request_inputs(request)
    assert np.array_equal(decoded["first"], first) and np.array_equal(decoded["last"], last)


def test_binary_bytes_tensor_is_taken_as_sent() -> None:
    raw = codec.encode_bytes([b"\xff\x00", b"ok"])
    request = parsed(body(binary_tensor("BYTES", [2], len(raw))), raw).request
    assert list(request.raw_input_contents) == [raw]


def test_the_request_carries_model_version_and_id() -> None:
    request = parsed(body(tensor("FP32", [1], [1.0]), id="abc")).request
    assert (request.model_name, request.model_version, request.id) == ("m", "1", "abc")


@pytest.mark.parametrize(
    ("item", "binary", "words"),
    [
        pytest.param(tensor("FP32", [2, 3], [1, 2, 3, 4, 5]), b"", ["needs 6", "got 5"], id="few"),
        pytest.param(tensor("FP32", [1], [[1], [2]]), b"", ["needs 1", "got 2"], id="too-many"),
        pytest.param(tensor("INT32", [3], [[1, 2], [3]]), b"", ["nested evenly"], id="ragged"),
        pytest.param(tensor("FP32", [2], ["1", "2"]), b"", ["not FP32"], id="strings-in-fp32"),
        pytest.param(tensor("INT8", [2], [1, "2"]), b"", ["not INT8"], id="string-in-int8"),
        pytest.param(tensor("INT64", [2], [1.5, 2]), b"", ["not INT64"], id="float-in-int64"),
        pytest.param(tensor("INT32", [1], [1.0]), b"", ["not INT32"], id="whole-float-in-int32"),
        pytest.param(tensor("FP32", [2], [True, False]), b"", ["not FP32"], id="bools-in-fp32"),
        pytest.param(tensor("UINT8", [1], [True]), b"", ["not UINT8"], id="bool-in-uint8"),
        pytest.param(tensor("BOOL", [2], [1, 0]), b"", ["not BOOL"], id="ints-in-bool"),
        pytest.param(tensor("BOOL", [2], [True, 1]), b"", ["not BOOL"], id="int-in-bool"),
        pytest.param(tensor("BYTES", [2], [1, 2]), b"", ["not BYTES"], id="numbers-in-bytes"),
        pytest.param(tensor("FP32", [2], [None, 1]), b"", ["not FP32"], id="null-in-fp32"),
        pytest.param(tensor("FP32", [1], [{"a": 1}]), b"", ["not FP32"], id="object-in-fp32"),
        pytest.param(tensor("UINT8", [2], [0, 300]), b"", ["out of range for UINT8"], id="300"),
        pytest.param(tensor("UINT32", [1], [-1]), b"", ["out of range for UINT32"], id="-1"),
        pytest.param(tensor("INT8", [2], [-129, 0]), b"", ["out of range for INT8"], id="-129"),
        pytest.param(tensor("INT64", [1], [2**63]), b"", ["out of range for INT64"], id="2^63"),
        pytest.param(tensor("FP32", [1], [1e39]), b"", ["out of range for FP32"], id="1e39"),
        pytest.param(tensor("FP16", [1], [70000.0]), b"", ["out of range for FP16"], id="7e4"),
        pytest.param(tensor("FP32", [-1], []), b"", ["dimension 0", "negative"], id="negative"),
        pytest.param(tensor("FP32", [2, -3], []), b"", ["dimension 1", "negative"], id="negative1"),
        pytest.param(tensor("FP32", 3, [1, 2, 3]), b"", ["`shape`"], id="shape-int"),
        pytest.param(tensor("FP32", "3", [1, 2, 3]), b"", ["`shape`"], id="shape-string"),
        pytest.param(tensor("FP32", [1.5], [1]), b"", ["`shape`"], id="shape-float"),
        pytest.param(tensor("FP32", [True], [1]), b"", ["`shape`"], id="shape-bool"),
        pytest.param(tensor("FP32", None, [1]), b"", ["`shape`"], id="shape-missing"),
        pytest.param(tensor("FP8", [1], [1]), b"", ["unknown datatype"], id="datatype"),
        pytest.param(tensor(5, [1], [1]), b"", ["`datatype`"], id="datatype-int"),
        pytest.param(tensor("FP32", [1], None), b"", ["needs `data`"], id="no-data"),
        pytest.param(tensor("FP32", [1], 1.0), b"", ["needs `data`"], id="data-scalar"),
        pytest.param(
            tensor("FP32", [1], [1], parameters=[]), b"", ["`parameters`"], id="parameters"
        ),
        pytest.param(
            binary_tensor("UINT8", [8], 8),
            b"\x00" * 4,
            ["binary_data_size is 8", "only 4 bytes"],
            id="binary-beyond-data",
        ),
        pytest.param(
            tensor("UINT8", [1], [1], parameters={"binary_data_size": 1}),
            b"\x00",
            ["both `data` and binary_data_size"],
            id="data-and-binary",
        ),
        pytest.param(binary_tensor("UINT8", [1], -1), b"\x00", ["non-negative"], id="size-neg"),
        pytest.param(binary_tensor("UINT8", [1], True), b"\x00", ["non-negative"], id="size-bool"),
        pytest.param(binary_tensor("UINT8", [1], "1"), b"\x00", ["non-negative"], id="size-str"),
        pytest.param(binary_tensor("UINT8", [1], 1.0), b"\x00", ["non-negative"], id="size-float"),
    ],
)
def test_a_bad_input_is_refused_naming_it(item: dict, binary: bytes, words: list[str]) -> None:
    message = refused(body(tensor("FP32", [1], [0.0], name="fine"), item), binary)
    assert "input 'x'" in message
    for word in words:
        assert word in message


@pytest.mark.parametrize(("datatype", "data"), [("INT32", [1, True]), ("FP32", [0.5, False])])
def test_a_bool_among_numbers_is_refused(datatype: str, data: list) -> None:
    assert f"not {datatype}" in refused(body(tensor(datatype, [2], data)))


@pytest.mark.parametrize("data", [["a", 1], ["a", True], ["a", 0.5]])
def test_a_number_among_strings_is_refused(data: list) -> None:
    assert "not BYTES" in refused(body(tensor("BYTES", [len(data)], data)))


def test_a_string_keeps_its_trailing_nul() -> None:
    request = parsed(body(tensor("BYTES", [2], ["a\x00", "\x00"]))).request
    assert request.raw_input_contents[0] == codec.encode_bytes([b"a\x00", b"\x00"])


@pytest.mark.parametrize(
    ("document", "binary", "words"),
    [
        pytest.param({}, b"", ["needs `inputs`"], id="no-inputs"),
        pytest.param({"inputs": []}, b"", ["needs `inputs`"], id="empty-inputs"),
        pytest.param({"inputs": {"x": 1}}, b"", ["needs `inputs`"], id="inputs-object"),
        pytest.param(body(5), b"", ["each of `inputs` must be an object"], id="input-number"),
        pytest.param(body({"datatype": "FP32"}), b"", ["an input needs `name`"], id="no-name"),
        pytest.param(body(tensor("FP32", [1], [1], name="")), b"", ["`name`"], id="empty-name"),
        pytest.param(
            body(tensor("FP32", [1], [1]), id=5), b"", ["the request needs `id`"], id="id"
        ),
        pytest.param(
            body(tensor("FP32", [1], [1]), parameters=[1]),
            b"",
            ["the request: `parameters` must be an object"],
            id="parameters",
        ),
        pytest.param(
            body(binary_tensor("UINT8", [4], 4)),
            b"\x00" * 6,
            ["2 bytes of binary data follow", "(4 bytes)"],
            id="leftover",
        ),
        pytest.param(
            body(tensor("UINT8", [1], [1])),
            b"\x00",
            ["1 bytes of binary data follow", "(0 bytes)"],
            id="binary-unclaimed",
        ),
    ],
)
def test_a_bad_request_is_refused_saying_why(document: dict, binary: bytes, words) -> None:
    message = refused(document, binary)
    for word in words:
        assert word in message


def test_split_takes_the_header_and_the_binary_after_it() -> None:
    assert tensors.split(b'{"a":1}xyz', 7) == (b'{"a":1}', b"xyz")
    assert tensors.split(b'{"a":1}', 7) == (b'{"a":1}', b"")
    assert tensors.split(b'{"a":1}', None) == (b'{"a":1}', b"")


def test_a_header_length_past_the_body_is_refused() -> None:
    with pytest.raises(InvalidArgument) as caught:
        tensors.split(b'{"a":1}', 8)
    assert "inference-header-content-length is 8" in str(caught.value)
    assert "the body has 7 bytes" in str(caught.value)


@pytest.mark.parametrize(
    ("header", "words"),
    [(b'{"inputs": [', "not valid JSON"), (b"[1]", "a JSON object"), (b"", "not valid JSON")],
)
def test_a_header_that_is_no_json_object_is_refused(header: bytes, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        tensors.parse(header)


def test_request_parameters_of_each_json_type() -> None:
    parameters = {
        "text": "hello",
        "count": -5,
        "largest": 2**63 - 1,
        "ratio": 0.25,
        "flag": True,
        "off": False,
        "binary_data_output": True,
    }
    result = parsed(body(tensor("FP32", [1], [1.0]), parameters=parameters))
    assert tensors.parameters_of(result.request.parameters) == {
        key: value for key, value in parameters.items() if key != "binary_data_output"
    }
    kinds = {key: p.WhichOneof("parameter_choice") for key, p in result.request.parameters.items()}
    assert kinds == {
        "text": "string_param",
        "count": "int64_param",
        "largest": "int64_param",
        "ratio": "double_param",
        "flag": "bool_param",
        "off": "bool_param",
    }
    assert result.binary_default is True


@pytest.mark.parametrize(
    ("value", "words"),
    [
        pytest.param([1], "must be a string, a number or a boolean", id="list"),
        pytest.param({"a": 1}, "must be a string, a number or a boolean", id="dict"),
        pytest.param(None, "must be a string, a number or a boolean", id="null"),
        pytest.param(2**63, "out of range", id="2^63"),
        pytest.param(2**64 - 1, "out of range", id="2^64-1"),
    ],
)
def test_a_parameter_of_a_refused_kind_is_named(value: Any, words: str) -> None:
    message = refused(body(tensor("FP32", [1], [1.0]), parameters={"knob": value}))
    assert "parameter 'knob'" in message and words in message


def test_binary_data_output_is_off_unless_true() -> None:
    for value in (False, "true", 1):
        document = body(tensor("FP32", [1], [1.0]), parameters={"binary_data_output": value})
        assert parsed(document).binary_default is False


def test_outputs_say_which_to_return_and_how() -> None:
    outputs = [
        {"name": "a", "parameters": {"binary_data": True}},
        {"name": "b"},
        {"name": "c", "parameters": {"binary_data": False}},
        {"name": "d", "parameters": {"binary_data": "yes"}},
    ]
    result = parsed(body(tensor("FP32", [1], [1.0]), outputs=outputs))
    assert [output.name for output in result.request.outputs] == ["a", "b", "c", "d"]
    assert result.binary == {"a": True, "c": False}
    assert result.binary_default is False


def test_an_output_carries_its_parameters() -> None:
    outputs = [{"name": "scores", "parameters": {"classification": 3, "binary_data": True}}]
    result = parsed(body(tensor("FP32", [1], [1.0]), outputs=outputs))
    parameters = result.request.outputs[0].parameters
    assert parameters["classification"].int64_param == 3 and result.binary == {"scores": True}


def test_no_outputs_named_asks_for_all() -> None:
    result = parsed(body(tensor("FP32", [1], [1.0])))
    assert len(result.request.outputs) == 0 and result.binary == {}


@pytest.mark.parametrize(
    ("outputs", "words"),
    [
        pytest.param(
            [{"name": "scores", "parameters": {"classification": [3]}}],
            ["output 'scores': parameter 'classification'"],
            id="classification",
        ),
        pytest.param({"name": "a"}, ["`outputs` must be a list"], id="object"),
        pytest.param(["a"], ["each of `outputs` must be an object"], id="string"),
        pytest.param([{"parameters": {}}], ["an output needs `name`"], id="no-name"),
        pytest.param(
            [{"name": "a", "parameters": 1}], ["output 'a': `parameters`"], id="parameters"
        ),
    ],
)
def test_bad_outputs_are_refused(outputs: Any, words: list[str]) -> None:
    message = refused(body(tensor("FP32", [1], [1.0]), outputs=outputs))
    for word in words:
        assert word in message


def answer(**arrays: np.ndarray) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name="digits", model_version="1", id="req-1")
    response.parameters["strata.arm"].string_param = "a"
    response.parameters["strata.level"].int64_param = 0
    response.parameters["strata.degraded"].bool_param = False
    codec.add_outputs(response, arrays)
    return response


def asked(binary: dict[str, bool] | None = None, default: bool = False) -> tensors.Parsed:
    return tensors.Parsed(v2.ModelInferRequest(), binary or {}, default)


SCORES = np.array([[0.5, 0.25]], dtype=np.float32)
LABELS = np.array([[b"cat", "dög".encode()]], dtype=object)


def test_a_json_answer_has_every_output_as_data() -> None:
    content, header_length = tensors.to_body(answer(scores=SCORES, labels=LABELS), asked())
    assert header_length is None
    assert orjson.loads(content) == {
        "model_name": "digits",
        "model_version": "1",
        "id": "req-1",
        "parameters": {"strata.arm": "a", "strata.level": 0, "strata.degraded": False},
        "outputs": [
            {"name": "scores", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 0.25]},
            {"name": "labels", "datatype": "BYTES", "shape": [1, 2], "data": ["cat", "dög"]},
        ],
    }


def test_binary_data_output_sends_every_output_after_the_header() -> None:
    response = answer(scores=SCORES, labels=LABELS)
    content, header_length = tensors.to_body(response, asked(default=True))
    assert header_length is not None
    header = orjson.loads(content[:header_length])
    assert content[header_length:] == b"".join(response.raw_output_contents)
    sizes = [output["parameters"]["binary_data_size"] for output in header["outputs"]]
    assert sizes == [len(raw) for raw in response.raw_output_contents]
    assert all("data" not in output for output in header["outputs"])


def test_an_outputs_own_flag_overrides_binary_data_output() -> None:
    document = body(
        tensor("FP32", [1], [1.0]),
        parameters={"binary_data_output": True},
        outputs=[{"name": "scores"}, {"name": "labels", "parameters": {"binary_data": False}}],
    )
    response = answer(scores=SCORES, labels=LABELS)
    content, header_length = tensors.to_body(response, parsed(document))
    assert header_length is not None
    scores, labels = orjson.loads(content[:header_length])["outputs"]
    assert scores["parameters"] == {"binary_data_size": SCORES.nbytes}
    assert labels["data"] == ["cat", "dög"]
    assert content[header_length:] == SCORES.tobytes()


def test_one_binary_output_among_json_ones() -> None:
    response = answer(scores=SCORES, labels=LABELS)
    content, header_length = tensors.to_body(response, asked({"labels": True}))
    assert header_length is not None
    assert content[header_length:] == response.raw_output_contents[1]
    scores = orjson.loads(content[:header_length])["outputs"][0]
    assert scores["data"] == [0.5, 0.25]


def json_data(array: np.ndarray) -> list:
    content, _ = tensors.to_body(answer(y=array), asked())
    return orjson.loads(content)["outputs"][0]["data"]


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), min_size=1))
def test_float32_json_values_parse_back_to_the_same_bytes(values: list[float]) -> None:
    array = np.array(values, dtype=np.float32)
    assert np.array(json_data(array), dtype=np.float32).tobytes() == array.tobytes()


@pytest.mark.parametrize("datatype", ["FP16", "FP32", "FP64"])
def test_extreme_floats_parse_back_to_the_same_bytes(datatype: str) -> None:
    dtype = codec.DTYPES[datatype]
    info = np.finfo(dtype)
    extremes = [info.max, info.min, info.tiny, info.smallest_subnormal, -0.0, 0.1, 1 / 3]
    array = np.array(extremes, dtype=dtype)
    assert np.array(json_data(array), dtype=dtype).tobytes() == array.tobytes()


@pytest.mark.parametrize("datatype", [d for d in DATATYPES if d not in ("BYTES", "FP16")])
def test_every_numeric_output_is_exact_as_json(datatype: str) -> None:
    array = np.array(sample(datatype), dtype=codec.DTYPES[datatype])
    assert json_data(array) == flat(sample(datatype))


def test_bytes_outputs_are_strings() -> None:
    strings = ["", "héllo", "日本語", "🚀"]
    assert json_data(np.array([s.encode() for s in strings], dtype=object)) == strings


def test_an_output_that_is_not_utf8_must_be_asked_for_as_binary() -> None:
    response = answer(blob=np.array([b"ok", b"\xff\xfe"], dtype=object))
    with pytest.raises(InvalidArgument) as caught:
        tensors.to_body(response, asked())
    assert "output 'blob'" in str(caught.value)
    assert '"parameters": {"binary_data": true}' in str(caught.value)
    content, header_length = tensors.to_body(response, asked({"blob": True}))
    assert content[header_length:] == response.raw_output_contents[0]


def test_an_empty_output_is_an_empty_list() -> None:
    assert json_data(np.zeros((0, 3), dtype=np.float32)) == []
