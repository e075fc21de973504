"""Hostile input for every port: hypothesis strategies for v2 and strata.v1 messages, what a
client may be answered, and the issue's findings.

Shared by tests/fuzz (the gateway; `make fuzz` runs its long profile) and tests/hostile
(every port). `make test` runs the "short" profile; HYPOTHESIS_PROFILE=long a long one.
tests/support/ports.py has the ports, their good requests and the watch.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from strata.wire.flight import ROWS, TIMEOUTS, TRACE_CONTEXTS

# No explain phase: it reruns a failure many times over to annotate it, against live servers.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink]
PATIENT = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow], "phases": PHASES}
settings.register_profile("short", max_examples=120, derandomize=True, **PATIENT)  # repeatable
settings.register_profile("long", max_examples=5000, **PATIENT)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "short"))

# The message limit of the systems the fuzz suite starts: oversized messages are cheap to make.
MAX_MESSAGE = 1 << 20


def share(fraction: float) -> settings:
    """Settings for a test that runs `fraction` of the profile's examples (at least 5)."""
    return settings(max_examples=max(5, int(settings().max_examples * fraction)))


# What a client may be answered.

S = grpc.StatusCode
CLIENT = frozenset(
    {
        S.OK,
        S.INVALID_ARGUMENT,
        S.NOT_FOUND,
        S.FAILED_PRECONDITION,
        S.RESOURCE_EXHAUSTED,
        S.OUT_OF_RANGE,
    }
)
REFUSED = CLIENT - {S.OK}
# Load and unload may also need credentials, or be switched off.
CONTROL = CLIENT | {S.UNAUTHENTICATED, S.PERMISSION_DENIED, S.UNIMPLEMENTED}


def answer(call: Callable[[], Any], allowed=CLIENT) -> tuple[Any, S]:
    """`call()`'s reply (None when refused) and its status, which must be one `allowed`, with
    a message unless OK."""
    try:
        reply, code, details = call(), S.OK, ""
    except grpc.RpcError as exc:
        reply, code, details = None, exc.code(), exc.details()
    assert code in allowed, f"{code.name}: {details}"
    assert code == S.OK or details, f"{code.name} without a message"
    return reply, code


def burst(method, request, copies: int = 8, allowed=CLIENT) -> list[tuple[Any, S]]:
    """`copies` of `request` on a unary `method` at once, each answer checked by `answer`."""
    futures = [method.future(request, timeout=15) for _ in range(copies)]
    return [answer(future.result, allowed) for future in futures]


def status(value: int) -> S:
    return next((code for code in S if code.value[0] == value), S.UNKNOWN)


def item_outcomes(
    request: v1.ProcessRequest, reply: v1.ProcessResponse, allowed=CLIENT
) -> list[list[S]]:
    """Each item's outcome (one per member for a flight), every one of them `allowed`, with
    a message when it failed; the items and members come back in order, ids echoed."""
    assert [r.id for r in reply.results] == [q.id for q in request.requests]
    outcomes = []
    for item, result in zip(request.requests, reply.results, strict=True):
        if item.members:
            assert not result.HasField("error"), "a flight answers per member"
            assert [m.id for m in result.members] == [m.id for m in item.members]
            errors = [m.error if m.HasField("error") else None for m in result.members]
        else:
            errors = [result.error if result.HasField("error") else None]
        codes = [S.OK if e is None else status(e.code) for e in errors]
        for code, error in zip(codes, errors, strict=True):
            assert code in allowed, f"item {item.id!r}: {code.name}: {error and error.message}"
            assert error is None or error.message, f"item {item.id!r}: {code.name}, no message"
        outcomes.append(codes)
    return outcomes


def finite(arrays: codec.Arrays) -> bool:
    """Whether every floating-point value in `arrays` is finite."""
    return all(np.isfinite(a).all() for a in arrays.values() if a.dtype.kind == "f")


# Strategies.

DATATYPES = [*codec.DTYPES, "FP8", "", "fp32", "STRING"]
HUGE = [0, 1 << 20, 64_000_000, 1 << 40, -(1 << 40), 2**62, 2**63 - 1, -(2**63)]
dims = st.one_of(st.integers(-3, 70), st.sampled_from(HUGE))
# numpy allows 64 dimensions; the ranks beyond are given whole (quick to shrink).
shapes = st.one_of(st.lists(dims, max_size=4), st.sampled_from([[1] * 64, [1] * 65, [1] * 70]))
NASTY_NAMES = ["", " ", ".", "..", "../digits", "digits/1", "/etc/passwd", "digits\x00", "DIGITS"]
NASTY_NAMES += ["digits ", "-x", "²", "x" * 300]  # longer than a file name may be
hostile_names = st.one_of(st.sampled_from(NASTY_NAMES), st.text(max_size=12))
NASTY_VERSIONS = ["", "0", "-1", "01", "+1", " 1", "1.0", "1e3", "x", str(2**63)]
NASTY_VERSIONS += ["²", "\u0661", "9" * 5000]  # digits to str.isdigit, not to int()
versions = st.one_of(
    st.sampled_from(NASTY_VERSIONS), st.text(max_size=6), st.integers(-(2**70), 2**70).map(str)
)
counts = st.lists(st.one_of(st.integers(-2, 8), st.sampled_from(HUGE)), min_size=1, max_size=4)
comma_lists = counts.map(lambda values: ",".join(map(str, values)))
traceparents = st.one_of(
    st.text(max_size=60),
    st.builds(
        "00-{}-{}-{}".format,
        st.text("0123456789abcdef", min_size=32, max_size=32),
        st.text("0123456789abcdef", min_size=16, max_size=16),
        st.sampled_from(["00", "01", "ff", "zz"]),
    ),
)
# The v2 parameters some layer reads (the gateway, inference, flights), and any other.
PARAMETER_NAMES = [ROWS, TRACE_CONTEXTS, TIMEOUTS, "strata.arm", "timeout", "priority"]
PARAMETER_NAMES += ["skip_batching", "core_only"]
parameter = st.one_of(
    st.builds(v2.InferParameter, bool_param=st.booleans()),
    st.builds(v2.InferParameter, int64_param=st.integers(-(1 << 63), (1 << 63) - 1)),
    st.builds(v2.InferParameter, uint64_param=st.integers(0, (1 << 64) - 1)),
    st.builds(v2.InferParameter, string_param=st.one_of(st.text(max_size=20), comma_lists)),
    st.builds(v2.InferParameter, double_param=st.floats(allow_nan=True)),
)


def names(known: Sequence[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(list(known)), st.text(max_size=8))


@st.composite
def tensors(draw, known: Sequence[str]) -> v1.Tensor:
    """A tensor whose data fits its small shape, or any header with any bytes."""
    tensor = v1.Tensor(name=draw(names(known)), datatype=draw(st.sampled_from(DATATYPES)))
    dtype = codec.DTYPES.get(tensor.datatype)
    if dtype is None or draw(st.booleans()):
        tensor.shape.extend(draw(shapes))
        tensor.data = draw(st.binary(max_size=2048))
        return tensor
    small = st.lists(st.sampled_from([0, 1, 2, 3, 8, 10, 30, 64]), min_size=1, max_size=3)
    tensor.shape.extend(draw(small.filter(lambda shape: math.prod(shape) <= 512)))
    count = math.prod(tensor.shape)
    if tensor.datatype == "BYTES":
        items = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        tensor.data = codec.encode_bytes(items)
    else:
        size = count * dtype.itemsize
        tensor.data = draw(st.binary(min_size=size, max_size=size))
    return tensor


@st.composite
def v2_requests(draw, models: Sequence[str], inputs: Sequence[str]) -> v2.ModelInferRequest:
    """A v2 ModelInferRequest: any models, versions, tensors (raw, typed, mixed or extra
    contents), parameters (flight ones too) and outputs."""
    request = v2.ModelInferRequest(
        model_name=draw(st.one_of(st.sampled_from(list(models)), hostile_names)),
        model_version=draw(st.one_of(st.sampled_from(["", "1", "2"]), versions)),
        id=draw(st.text(max_size=8)),
    )
    raw = draw(st.booleans())
    for tensor in draw(st.lists(tensors(inputs), max_size=3)):
        added = request.inputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if raw:
            request.raw_input_contents.append(tensor.data)
            continue
        contents = added.contents
        contents.int_contents.extend(
            draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1), max_size=64))
        )
        contents.fp32_contents.extend(draw(st.lists(st.floats(width=32), max_size=64)))
        contents.bytes_contents.extend(draw(st.lists(st.binary(max_size=16), max_size=8)))
    if draw(st.booleans()) and request.inputs:
        request.raw_input_contents.append(draw(st.binary(max_size=64)))  # mixed or extra
    keys = st.one_of(st.sampled_from(PARAMETER_NAMES), st.text(max_size=10))
    for key, value in draw(st.dictionaries(keys, parameter, max_size=4)).items():
        request.parameters[key].CopyFrom(value)
    for output in draw(
        st.lists(names(["labels", "scores", "label", "score", "logits"]), max_size=2)
    ):
        request.outputs.add(name=output)
    return request


@st.composite
def process_items(draw, pipelines: Sequence[str], known: Sequence[str]) -> v1.Request:
    """A strata.v1 Request: any pipeline, tensors, parameters, trace context and members."""
    item = v1.Request(
        id=draw(st.text(max_size=8)),
        pipeline=draw(st.one_of(st.sampled_from(list(pipelines)), hostile_names)),
        tensors=draw(st.lists(tensors(known), max_size=3)),
        parameters=draw(st.dictionaries(names(["core_only"]), st.text(max_size=8), max_size=3)),
    )
    if draw(st.booleans()):
        item.trace_context["traceparent"] = draw(traceparents)
    if draw(st.booleans()):
        first = item.tensors[0].shape[:1] if item.tensors else []
        rows = first[0] if first and 1 <= first[0] <= 8 else 0
        fitting = st.just([1] * rows) if rows else counts  # rows that add up, or any
        for i, count in enumerate(draw(st.one_of(fitting, counts))):
            member = item.members.add(id=f"m{i}", rows=count)
            if draw(st.booleans()):
                member.trace_context["traceparent"] = draw(traceparents)
    return item


def process_requests(
    pipelines: Sequence[str], known: Sequence[str]
) -> st.SearchStrategy[list[v1.Request]]:
    return st.lists(process_items(pipelines, known), min_size=1, max_size=3)


# The findings: a few bytes that declare a huge or odd shape.


@dataclass(frozen=True)
class Finding:
    label: str
    pipeline: str
    datatype: str
    shape: tuple[int, ...]
    data: bytes = b""

    def tensor(self, name: str) -> v1.Tensor:
        return v1.Tensor(name=name, datatype=self.datatype, shape=self.shape, data=self.data)

    def request(self, model: str, name: str) -> v2.ModelInferRequest:
        request = v2.ModelInferRequest(model_name=model)
        request.inputs.add(name=name, datatype=self.datatype, shape=self.shape)
        request.raw_input_contents.append(self.data)
        return request


FINDINGS = [
    Finding("bytes-64e6", "digits", "BYTES", (64_000_000,), bytes(60)),
    Finding("bytes-2^40", "digits", "BYTES", (1 << 40,), bytes(8)),
    Finding("bytes-2^62x4", "digits", "BYTES", (2**62, 4)),
    Finding("bytes-2^63-1", "digits", "BYTES", (2**63 - 1,)),
    Finding("uint8-rank70", "digits", "UINT8", (1,) * 70, b"\0"),
    Finding("uint8-2^62x0x2^62", "digits", "UINT8", (2**62, 0, 2**62)),
    Finding("fp32-tabular-2^62x0", "tabular", "FP32", (2**62, 0)),
]
LONG_NAME, ODD_VERSIONS = "x" * 5000, ["²", "9" * 5000]
