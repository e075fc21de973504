"""A pipeline of several models in the request's trace: each later stage is a span of the
gateway's under the request's, named for the stage, with the model, arm and rows it carried,
and the inference call it made sits under it (the first model's under the request's)."""

import secrets
import time
from collections.abc import Iterator

import grpc
import numpy as np
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.telemetry.traces import Receiver, Span, roots
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.e2e.default_system.test_stages import BUILD, cascade
from tests.support.system import running_system

LAYERS = {f"strata-{name}" for name in ("gateway", "preprocess", "inference", "postprocess")}


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, Receiver]]:
    with Receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        with running_system(tmp_path_factory.mktemp("traced"), env=env) as system:
            yield system, receiver


def inference_spans(spans: list[Span]) -> list[Span]:
    return [s for s in spans if s.service == "strata-inference"]


def test_a_stage_is_a_span_over_its_models_work(traced) -> None:
    system, receiver = traced
    data = np.load(BUILD / "data" / "digits_test.npz")
    _, unsure = cascade(data["images"])
    row = int(np.flatnonzero(unsure)[0])
    trace_id = secrets.token_hex(16)
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    request = codec.build_request("digits-cascade", {"images": data["images"][row : row + 1]})
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    reply = stub.ModelInfer(request, metadata=(("traceparent", traceparent),), timeout=10)
    assert reply.parameters["strata.stages"].string_param == "digits,large"
    spans = receiver.wait_for(trace_id, LAYERS)
    end = time.monotonic() + 10
    while len(inference_spans(spans)) < 2 and time.monotonic() < end:  # each exports apart
        time.sleep(0.05)
        spans = receiver.trace(trace_id)
    (stage,) = [s for s in spans if s.name == "stage large"]
    assert stage.service == "strata-gateway"
    assert stage.attributes["strata.stage"] == "large"
    assert stage.attributes["strata.model"] == "digits-large"
    assert stage.attributes["strata.rows"] == 1
    assert stage.attributes["strata.requests"] == 1
    (root,) = roots(spans)
    inference = inference_spans(spans)
    assert len(inference) == 2, "one call per model"
    assert {s.parent_id for s in inference} == {stage.span_id, stage.parent_id}
    assert stage.parent_id == root.span_id
    assert "strata.hop.inference-a_ms" in stage.attributes, "the stage's call is timed on it"
