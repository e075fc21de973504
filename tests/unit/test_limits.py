"""Tensor limits: a hostile declaration is refused before anything is allocated, on every
decode path, with INVALID_ARGUMENT naming the tensor and the limit; every shipped input fits."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from strata.calls import v1process
from strata.config import load_settings
from strata.config.limits import TensorLimits
from strata.errors import InvalidArgument
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec, limits, stack
from strata.wire.limits import Limits, check_declared
from tests.support.system import DEFAULT_CONFIG, ROOT

DEFAULTS = Limits()

# (datatype, shape, data sent, words the refusal must say): the hostile client's findings.
HOSTILE = [
    pytest.param("BYTES", [64_000_000], b"\x00" * 60, ["64000000", "limit of 16777216"], id="64M"),
    pytest.param("BYTES", [1 << 40], b"", ["1099511627776", "limit of 16777216"], id="2^40"),
    pytest.param("BYTES", [2**62, 4], b"", [str(2**62), "limit of 16777216"], id="2^62x4"),
    pytest.param("BYTES", [2**63 - 1], b"", [str(2**63 - 1), "limit of 16777216"], id="2^63-1"),
    pytest.param("UINT8", [1] * 70, b"\x00", ["rank 70", "limit of 8", "62 more"], id="rank70"),
    pytest.param("UINT8", [2**62, 0, 2**62], b"", [str(2**62), "limit of 16777216"], id="empty3"),
    pytest.param("FP32", [2**62, 0], b"", [str(2**62), "limit of 16777216"], id="empty2"),
    pytest.param(
        "FP32", [1 << 20, 0, 1 << 20], b"", ["spans 1099511627776", "limit of 67108864"], id="span"
    ),
    pytest.param("BYTES", [100_000], bytes(400_000), ["100000", "limit of 65536"], id="strings"),
    pytest.param(
        "INT64", [4096, 4096], b"", ["takes 134217728 bytes", "limit of 67108864"], id="bytes"
    ),
    pytest.param("BYTES", [16], b"\x00" * 40, ["needs at least 64 bytes", "got 40"], id="prefixes"),
    pytest.param("FP32", [3, -1], b"", ["negative dimension"], id="negative"),
]


def raw_request(datatype: str, shape: list[int], data: bytes) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype=datatype, shape=shape)
    request.raw_input_contents.append(data)
    return request


def typed_request(datatype: str, shape: list[int], data: bytes) -> v2.ModelInferRequest:
    request = v2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=shape)
    if datatype == "BYTES":
        tensor.contents.bytes_contents.extend([data])
    else:
        tensor.contents.uint_contents.extend(data)
    return request


# Every decode path, from its own wire form.
DECODERS: dict[str, Callable[[str, list[int], bytes], object]] = {
    "from_raw": lambda d, s, b: codec.from_raw("x", d, s, b),
    "from_tensor": lambda d, s, b: codec.from_tensor(
        v1.Tensor(name="x", datatype=d, shape=s, data=b)
    ),
    "request_inputs": lambda d, s, b: codec.request_inputs(raw_request(d, s, b)),
    "response_outputs": lambda d, s, b: codec.response_outputs(
        v2.ModelInferResponse(
            outputs=[v2.ModelInferResponse.InferOutputTensor(name="x", datatype=d, shape=s)],
            raw_output_contents=[b],
        )
    ),
}


@pytest.fixture
def installed() -> Iterator[None]:
    before = limits.installed()
    yield
    limits.install(before)


@pytest.mark.parametrize("decode", DECODERS.values(), ids=DECODERS.keys())
@pytest.mark.parametrize(("datatype", "shape", "data", "words"), HOSTILE)
def test_every_decode_path_refuses_hostile_declarations(
    decode, datatype: str, shape: list[int], data: bytes, words: list[str]
) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode(datatype, shape, data)
    for word in ["'x'", *words]:
        assert word in str(info.value)


@pytest.mark.parametrize(("datatype", "shape", "data", "words"), HOSTILE[:9])
def test_typed_contents_are_checked_before_they_are_counted(
    datatype: str, shape: list[int], data: bytes, words: list[str]
) -> None:
    with pytest.raises(InvalidArgument) as info:
        codec.request_inputs(typed_request(datatype, shape, data))
    for word in ["'x'", *words]:
        assert word in str(info.value)


@pytest.mark.parametrize("make", [raw_request, typed_request])
def test_a_huge_declaration_is_refused_without_allocating(make) -> None:
    request = make("BYTES", [64_000_000], b"\x00" * 60)
    assert request.ByteSize() < 100
    tracemalloc.start()
    try:
        for _ in range(4):
            with pytest.raises(InvalidArgument):
                codec.request_inputs(request)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024  # the object array it declares would take 512 MB


def test_within_the_limits_empty_and_full_tensors_still_decode() -> None:
    assert codec.from_raw("x", "FP32", [0, 30], b"").shape == (0, 30)
    assert codec.from_raw("x", "UINT8", [1, 0, 1 << 20], b"").shape == (1, 0, 1 << 20)
    assert codec.from_raw("x", "BYTES", [0, 3], b"").shape == (0, 3)
    big = np.zeros((64, 512, 512), np.uint8)  # the digits pipeline's largest input
    assert codec.from_raw("x", "UINT8", big.shape, big.tobytes()).shape == big.shape
    text = np.array([b"a" * 1000] * 64, dtype=object)
    assert codec.from_raw("x", "BYTES", [64], codec.to_raw(text)).shape == (64,)


def test_check_declared_returns_the_count_and_takes_other_limits() -> None:
    assert check_declared("x", "FP32", [2, 3], 24) == 6
    assert check_declared("x", "FP32", [5, 0], 0) == 0
    assert check_declared("x", "BYTES", [2], 8) == 2
    assert check_declared("x", "INT8", [3], None) == 3
    tight = Limits(max_rank=2, max_dimension=10, max_elements=50, max_bytes=64)
    for shape, words in [
        ([1, 1, 1], "limit of 2"),
        ([11], "limit of 10"),
        ([10, 6], "limit of 50"),
        ([10, 5], "limit of 64"),
    ]:
        with pytest.raises(InvalidArgument, match=words):
            check_declared("x", "FP32", shape, None, tight)
    with pytest.raises(InvalidArgument, match="unknown datatype 'FP8'"):
        check_declared("x", "FP8", [1], 1)


def test_installed_limits_apply_to_every_decode(installed) -> None:
    limits.install(Limits(max_strings=2))
    assert codec.from_raw("s", "BYTES", [2], codec.encode_bytes([b"a", b"b"])).shape == (2,)
    with pytest.raises(InvalidArgument, match="holds 3 elements, more than the limit of 2"):
        codec.from_raw("s", "BYTES", [3], codec.encode_bytes([b"a", b"b", b"c"]))


def test_widths_agree_with_the_codecs_datatypes() -> None:
    assert set(limits.WIDTHS) == set(codec.DTYPES)
    for name, dtype in codec.DTYPES.items():
        if name != "BYTES":
            assert limits.WIDTHS[name] == dtype.itemsize


# configs/kustomization.yaml is kustomize's, not a Strata config (deploy/k8s reads it).
SHIPPED = sorted(p for p in (ROOT / "configs").glob("*.yaml") if p.name != "kustomization.yaml")


@pytest.mark.parametrize("config", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_pipeline_input_fits_the_defaults(config: Path) -> None:
    settings = load_settings(config)
    assert settings.limits.plain() == DEFAULTS
    for pipeline in settings.pipelines.values():
        for spec in pipeline.inputs:
            largest = [
                int(min(spec.limit(axis), pipeline.max_batch_size if axis == 0 else 4096))
                for axis in range(len(spec.shape))
            ]
            count = int(np.prod(largest))
            sent = count * limits.WIDTHS[spec.datatype]
            assert check_declared(spec.name, spec.datatype, largest, sent) == count


def test_the_config_sets_the_limits(tmp_path: Path) -> None:
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw["repository"] = str((DEFAULT_CONFIG.parent / raw["repository"]).resolve())
    raw["limits"] = {"max_rank": 4, "max_strings": 1000}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    configured = load_settings(path).limits
    assert configured == TensorLimits(max_rank=4, max_strings=1000)
    assert configured.plain() == Limits(max_rank=4, max_strings=1000)


def test_a_stack_is_cut_only_when_its_shape_matches_its_bytes() -> None:
    good = v1.Tensor(name="t", datatype="FP32", shape=[2, 3], data=bytes(24))
    assert stack.take([good], [1, 1], [1])[0].shape == [1, 3]
    short = v1.Tensor(name="t", datatype="FP32", shape=[2, 3], data=bytes(20))
    with pytest.raises(ValueError, match=r"malformed tensor in a stack.*needs 24 bytes, got 20"):
        stack.take([short], [1, 1], [1])
    endless = v1.Tensor(name="t", datatype="BYTES", shape=[2, 1 << 40], data=bytes(8))
    with pytest.raises(ValueError, match="limit of 16777216"):
        stack.take([endless], [1, 1], [0])


def handler(pipeline: str, arrays: codec.Arrays, parameters: object) -> v1process.Outputs:
    return arrays, {}


@pytest.mark.parametrize(("datatype", "shape", "data", "words"), HOSTILE[:9])
def test_a_process_item_with_a_hostile_tensor_fails_alone(
    datatype: str, shape: list[int], data: bytes, words: list[str]
) -> None:
    hostile = v1.Tensor(name="x", datatype=datatype, shape=shape, data=data)
    fine = codec.to_tensor("x", np.zeros((1, 2), np.float32))
    flight = v1.Request(id="f", pipeline="p", tensors=[hostile])
    flight.members.add(id="m1", rows=1)
    flight.members.add(id="m2", rows=1)
    call = v1.ProcessRequest(
        requests=[
            v1.Request(id="bad", pipeline="p", tensors=[hostile]),
            v1.Request(id="good", pipeline="p", tensors=[fine]),
            flight,
        ]
    )
    bad, good, flown = v1process.process_all(call, handler).results
    errors = [bad.error, *(member.error for member in flown.members)]
    for error in errors:
        assert error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        for word in ["'x'", *words]:
            assert word in error.message
    assert not good.HasField("error") and good.tensors[0].shape == [1, 2]
