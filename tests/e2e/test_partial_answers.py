"""Partial answers through the gateway: a skipped rule leaves out its optional output, the
answer names it, and it is never cached as a full answer; a required output that cannot be
made is a clear UNAVAILABLE, never INTERNAL."""

from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import running_system

TOKEN = "partial-admin-token-of-at-least-32-chars"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
SOFTMAX = {"kind": "softmax", "input": "logits", "output": "probabilities"}
TOPK = {"kind": "topk", "input": "probabilities", "k": 3, "values": "scores", "indices": "classes"}
LABELS = {
    **{"kind": "labels", "input": "classes", "output": "labels"},
    **{"file": "digits/model.yaml", "classes": 10},
}
# Flags labels matching a pattern; with a limit of 1 µs it always stops at its limit.
LATE = {
    **{"kind": "regex_filter", "name": "late_flag", "input": "labels", "output": "flagged"},
    **{"pattern": "x", "action": "flag", "timeout_seconds": 1e-6},
}
IMAGES = {"name": "images", "datatype": "UINT8", "shape": [-1, -1, -1], "max_shape": [8, 64, 64]}


def pipeline(last: dict, optional: bool = True) -> dict:
    """Digits with `last` as its final rule, whose output is optional (or not)."""
    late = last is LATE
    outputs = [
        {"name": "labels", "datatype": "BYTES", "shape": [-1, 3], "optional": not late},
        {"name": "scores", "datatype": "FP32", "shape": [-1, 3]},
    ]
    if late:
        outputs.append({"name": "flagged", "datatype": "BOOL", "shape": [-1, 3]})
        outputs[-1]["optional"] = optional
    return {
        "max_batch_size": 64,
        "cache": True,
        "inputs": [IMAGES],
        "outputs": outputs,
        "preprocess": [
            {"kind": "resize", "input": "images", "height": 8, "width": 8},
            {"kind": "scale", "input": "images", "factor": 1 / 255},
            {"kind": "flatten", "input": "images", "output": "pixels"},
        ],
        "model": {"name": "digits"},
        "postprocess": [SOFTMAX, TOPK, *([LABELS] if late else []), last],
    }


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        "gateway": {"admin_token": TOKEN},
        "pipelines": {
            "late": pipeline(LATE),
            "lean": pipeline({**LABELS, "name": "lean_labels", "core": False}),
            "asked": pipeline(
                {**LABELS, "name": "asked_labels", "when": {"parameter": "with_labels"}}
            ),
            "strict": pipeline(LATE, optional=False),
        },
    }
    with running_system(tmp_path_factory.mktemp("partial"), changes) as supervisor:
        yield supervisor


def infer(system: Supervisor, name: str, **parameters: str):
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    request = codec.build_request(name, {"images": np.zeros((1, 8, 8), np.uint8)})
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    return stub.ModelInfer(request, timeout=10)


def outputs(reply) -> set[str]:
    return {o.name for o in reply.outputs}


def partial(reply, rule: str) -> None:
    assert outputs(reply) == {"scores"}
    assert reply.parameters["strata.skipped_rules"].string_param == rule
    assert not reply.parameters["strata.cached"].bool_param
    assert codec.response_outputs(reply)["scores"].shape == (1, 3)


def test_a_rule_over_its_time_limit_leaves_out_its_optional_output(system) -> None:
    for _ in range(2):  # the second is not the first's answer from the cache
        late = infer(system, "late")
        assert outputs(late) == {"labels", "scores"}
        assert late.parameters["strata.skipped_rules"].string_param == "late_flag"
        assert not late.parameters["strata.cached"].bool_param


def test_level_one_skips_a_rule_that_is_not_core(system) -> None:
    admin = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    admin.ForceLevel(admin_pb2.ForceLevelRequest(level=1), metadata=AUTH)
    try:
        lean = infer(system, "lean")
    finally:
        admin.ForceLevel(admin_pb2.ForceLevelRequest(level=0), metadata=AUTH)
        admin.ForceLevel(admin_pb2.ForceLevelRequest(release=True), metadata=AUTH)
    partial(lean, "lean_labels")
    assert outputs(infer(system, "lean")) == {"labels", "scores"}, "level 0: a full answer"


def test_a_when_rule_runs_only_when_asked_and_answers_are_cached_apart(system) -> None:
    partial(infer(system, "asked"), "asked_labels")
    full = infer(system, "asked", with_labels="yes")
    assert outputs(full) == {"labels", "scores"}
    assert "strata.skipped_rules" not in full.parameters
    again = infer(system, "asked", with_labels="yes")
    assert again.parameters["strata.cached"].bool_param, "the full answer is cached"
    partial(infer(system, "asked"), "asked_labels")


def test_a_required_output_that_cannot_be_made_is_unavailable_naming_it(system) -> None:
    with pytest.raises(grpc.RpcError) as failed:
        infer(system, "strict")
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "required output 'flagged'" in failed.value.details()
    assert "late_flag" in failed.value.details()
