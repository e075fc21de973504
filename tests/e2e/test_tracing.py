"""What the four services export to an OTLP receiver: one trace per request, well formed."""

import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import requests
import yaml

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.telemetry.traces import Receiver, Span, roots
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import running_system


def all_spans(receiver: Receiver) -> list[Span]:
    """Every span the receiver holds, of every trace."""
    return [span for trace_id in receiver.quiet_traces(0) for span in receiver.trace(trace_id)]


LAYERS = {f"strata-{name}" for name in ("gateway", "preprocess", "inference", "postprocess")}
TOKEN = "gateway-admin-token-for-the-tracing-tests-0123"
# How long a trace may take to arrive whole: each process exports on its own 0.1 s schedule,
# which a busy machine (the suite's other workers) can stretch to seconds. A whole trace ends
# the wait at once, so a generous bound costs nothing and keeps these tests out of the timing part.
ARRIVAL = 60.0


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, Receiver]]:
    with Receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        folder: Path = tmp_path_factory.mktemp("traced")
        # One call in flight per hop: concurrent requests are all but sure to share calls.
        changes = {"gateway": {"flights": {"max_in_air": 1}, "admin_token": TOKEN}}
        with running_system(folder, changes, env=env) as system:
            yield system, receiver


def send(system: Supervisor, arrays: dict, trace_id: str, **params: str) -> grpc.RpcError | None:
    channel = grpc.insecure_channel(system.address("gateway"))
    stub = v2_grpc.GRPCInferenceServiceStub(channel)
    request = codec.build_request("digits", arrays)
    for key, value in params.items():
        request.parameters[key].string_param = value
    traceparent = f"00-{trace_id}-{secrets.token_hex(8)}-01"
    try:
        stub.ModelInfer(request, metadata=(("traceparent", traceparent),), timeout=10)
    except grpc.RpcError as exc:
        return exc
    return None


def root_of(spans: list[Span]) -> Span:
    found = roots(spans)
    assert len(found) == 1, [(s.service, s.name) for s in found]
    return found[0]


def test_one_trace_through_all_layers_with_steps_and_rules(traced) -> None:
    system, receiver = traced
    trace_id = secrets.token_hex(16)
    assert send(system, {"images": np.zeros((2, 16, 16), np.uint8)}, trace_id) is None
    spans = receiver.wait_for(trace_id, LAYERS, ARRIVAL)
    assert {s.service for s in spans} == LAYERS
    root = root_of(spans)
    assert root.service == "strata-gateway"
    attributes = root.attributes
    assert attributes["strata.pipeline"] == "digits"
    assert attributes["strata.arm"] in {"control", "canary"}
    assert attributes["strata.level"] == 0
    assert attributes["strata.input_shapes"] == ["images:2x16x16"]
    # Each step's and rule's time is an attribute of its layer's span, not a span of its own.
    assert timed(spans, "strata-preprocess", "strata.steps") == [
        "validate",
        "resize",
        "scale",
        "flatten",
    ]
    assert timed(spans, "strata-postprocess", "strata.rules") == ["softmax", "topk", "labels"]
    inference = next(s for s in spans if s.service == "strata-inference")
    assert "strata.queue_ms" in inference.attributes
    # Its batch held its call's request alone: recorded on the call's span, not a span more.
    assert inference.attributes["batch.requests"] == 1
    assert "batch.compute_ms" in inference.attributes
    # How long each hop took, as the gateway saw it: attributes of its span, not spans.
    assert {"strata.hop.preprocess_ms", "strata.hop.postprocess_ms"} <= set(root.attributes)
    assert all(s.parent_id == root.span_id for s in spans if s is not root), "one level deep"
    by_id = {s.span_id: s for s in spans}
    for span in spans:
        if span is not root:
            parent = by_id[span.parent_id]
            assert parent.start_ns <= span.start_ns, (span.name, parent.name)


def burst(system: Supervisor, receiver: Receiver, count: int) -> tuple[list[str], list[Span]]:
    """`count` concurrent traced requests to one arm; their trace ids and the batches they made."""
    trace_ids = [secrets.token_hex(16) for _ in range(count)]
    images = {"images": np.zeros((1, 8, 8), np.uint8)}
    threads = [
        threading.Thread(target=send, args=(system, images, t), kwargs={"strata.arm": "control"})
        for t in trace_ids
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    ours = {}
    for trace_id in trace_ids:
        # A request that flew with others has only the gateway's spans in its own trace.
        for span in receiver.wait_for(trace_id, {"strata-gateway"}):
            ours[span.span_id] = trace_id
    batches = batch_spans(receiver)
    return trace_ids, [b for b in batches if len({ours[i] for i in b.links if i in ours}) >= 2]


def batch_spans(receiver: Receiver) -> list[Span]:
    """The spans that record an inference batch: its own (`inference batch`), or, for a
    batch of one call's requests, that call's server span."""
    return [s for s in all_spans(receiver) if "batch.requests" in s.attributes]


def test_a_batch_span_links_the_requests_it_carried(traced) -> None:
    system, receiver = traced
    # The adaptive batcher runs a lone request at once, so whether two requests share a
    # batch depends on timing: a few bursts make one all but certain.
    for _ in range(5):
        trace_ids, linked = burst(system, receiver, 24)
        if linked:
            break
    assert linked, "no batch carried two of the concurrent requests"
    batch = linked[0]
    if batch.name == "inference batch":  # several calls' requests: a trace of its own
        assert batch.trace_id not in trace_ids
    else:  # one flight's: recorded on its inference call's span, in the flight lead's trace
        assert batch.trace_id in trace_ids
    assert batch.attributes["batch.requests"] >= 2


def flown(receiver: Receiver, trace_ids: list[str]) -> list[tuple[Span, Span]]:
    """(follower, lead): the root spans of two requests that shared a flight of several,
    the follower's linking to the lead's, in whose trace the flight's work is."""
    roots = {root.span_id: root for root in (root_of(receiver.trace(t)) for t in trace_ids)}
    return [(root, roots[link]) for root in roots.values() for link in root.links if link in roots]


def test_a_flight_of_several_is_in_its_leads_trace_and_the_others_link_to_it(traced) -> None:
    system, receiver = traced
    for _ in range(5):
        trace_ids, _ = burst(system, receiver, 24)
        pairs = flown(receiver, trace_ids)
        if pairs:
            break
    assert pairs, "no two concurrent requests shared a flight"
    follower, lead = pairs[0]
    assert lead.attributes["strata.flight_requests"] >= 2
    assert "strata.flight" in lead.attributes
    # The follower's own trace is its gateway span alone; the flight's work is traced once,
    # in the lead's: each layer's span of the call that carried it, a child of the lead's
    # span, linked to every request it carried.
    assert {s.service for s in receiver.trace(follower.trace_id)} == {"strata-gateway"}
    assert not [s for s in all_spans(receiver) if s.name == "flight"], "no span for the flight"
    shared = receiver.wait_for(lead.trace_id, LAYERS - {"strata-inference"}, ARRIVAL)
    assert not [s for s in shared if s.name == "flight digits"], "no span more for the flight"
    for layer in ("preprocess", "postprocess"):
        work = layer_span_of(shared, lead, layer)
        assert follower.span_id in work.links
        assert work.attributes["strata.requests"] >= 2
    run = layer_span_of(shared, lead, "preprocess")
    assert [entry.split()[0] for entry in run.attributes["strata.steps"]][1:3] == [
        "resize",
        "scale",
    ]
    assert linked_batch(receiver, follower.span_id), "the batch links to the request"


def timed(spans: list[Span], service: str, attribute: str) -> list[str]:
    """The names in the one `attribute` ("name 0.123 ms" entries) among `service`'s spans."""
    (entries,) = [
        s.attributes[attribute] for s in spans if s.service == service and attribute in s.attributes
    ]
    assert all(entry.endswith(" ms") for entry in entries)
    return [entry.split()[0] for entry in entries]


def linked_batch(receiver: Receiver, span_id: str, within: float = 30.0) -> bool:
    """Whether the span recording an inference batch links to `span_id` (inference exports
    on its own schedule, so its spans may arrive after the other layers')."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if any(span_id in b.links for b in batch_spans(receiver)):
            return True
        time.sleep(0.05)
    return False


def layer_span_of(spans: list[Span], parent: Span, layer: str) -> Span:
    """`layer`'s server span for the gateway's call made under `parent`."""
    return next(s for s in spans if s.parent_id == parent.span_id and s.service.endswith(layer))


def test_a_bad_request_leaves_an_error_span_with_its_kind(traced) -> None:
    system, receiver = traced
    trace_id = secrets.token_hex(16)
    error = send(system, {"images": np.zeros((1, 8, 8), np.float32)}, trace_id)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    spans = receiver.wait_for(trace_id, {"strata-gateway"})
    root = root_of(spans)
    assert root.status_code == 2  # ERROR
    assert "error" in root.events
    assert {s.service for s in spans} == {"strata-gateway"}, "no upstream was called"


def test_the_log_of_a_failing_request_carries_its_trace_id(traced) -> None:
    system, receiver = traced
    trace_id = secrets.token_hex(16)
    error = send(system, {"images": np.zeros((1, 3), np.uint8)}, trace_id)
    assert error is not None and error.code() == grpc.StatusCode.INVALID_ARGUMENT
    receiver.wait_for(trace_id, {"strata-gateway"})
    lines = (system.log_dir / "gateway.log").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    ours = [e for e in events if e.get("trace_id") == trace_id]
    assert ours and ours[0]["error_kind"] == "client" and "rank" in ours[0]["msg"]


def test_a_rest_request_joins_the_trace_of_its_traceparent_header(traced) -> None:
    system, receiver = traced
    trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
    document = {
        "inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 8, 8], "data": [0] * 64}]
    }
    with requests.Session() as session:
        session.trust_env = False  # loopback: no proxy from the environment
        response = session.post(
            f"http://{system.settings.services.gateway.rest}/v2/models/digits/infer",
            json=document,
            headers={"traceparent": f"00-{trace_id}-{parent}-01"},
            timeout=10,
        )
    assert response.status_code == 200, response.text
    spans = receiver.wait_for(trace_id, LAYERS, ARRIVAL)
    assert {s.service for s in spans} == LAYERS
    root = root_of(spans)
    assert (root.service, root.name) == ("strata-gateway", "POST /v2/models/{name}/infer")
    assert root.parent_id == parent, "the caller's span is the parent"
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["strata.pipeline"] == "digits"


def trace_settings(system: Supervisor, **settings: list[str]) -> dict[str, list[str]]:
    """The gateway's trace settings after `settings` (Triton's TraceSetting, admin token)."""
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    value = v2.TraceSettingRequest.SettingValue
    request = v2.TraceSettingRequest(settings={k: value(value=v) for k, v in settings.items()})
    auth = (("authorization", f"Bearer {TOKEN}"),)
    reply = stub.TraceSetting(request, metadata=auth, timeout=10)
    return {key: list(setting.value) for key, setting in reply.settings.items()}


def test_trace_settings_change_what_is_traced_live(traced) -> None:
    system, receiver = traced
    images = {"images": np.zeros((1, 8, 8), np.uint8)}
    try:
        assert trace_settings(system, trace_level=["OFF"])["trace_level"] == ["OFF"]
        dark = [secrets.token_hex(16) for _ in range(5)]
        for trace_id in dark:
            assert send(system, images, trace_id) is None
        rare = trace_settings(system, trace_level=["TIMESTAMPS"], trace_rate=["1000000"])
        assert rare["trace_rate"] == ["1000000"] and rare["trace_level"] == ["TIMESTAMPS"]
        scarce = [secrets.token_hex(16) for _ in range(5)]
        for trace_id in scarce:
            assert send(system, images, trace_id) is None
        assert trace_settings(system, trace_rate=["1"])["trace_rate"] == ["1"]
        lit = secrets.token_hex(16)
        assert send(system, images, lit) is None
        assert receiver.wait_for(lit, {"strata-gateway"})
        time.sleep(0.5)  # what the other requests would have exported has arrived by now
        assert not [t for t in dark + scarce if receiver.trace(t)]
    finally:
        back = trace_settings(system, trace_level=[], trace_rate=[])  # the config's
    assert back["trace_level"] == ["TIMESTAMPS"] and back["trace_rate"] == ["1"]


def reload(system: Supervisor) -> admin_pb2.ReloadResponse:
    stub = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    auth = (("authorization", f"Bearer {TOKEN}"),)
    return stub.Reload(admin_pb2.ReloadRequest(), metadata=auth, timeout=10)


def test_a_reload_of_the_sample_ratio_changes_what_is_traced_live(traced) -> None:
    """What a gateway of several processes, which refuses TraceSetting, does instead."""
    system, receiver = traced
    images = {"images": np.zeros((1, 8, 8), np.uint8)}
    original = system.config.read_text()
    raw = yaml.safe_load(original)
    raw.setdefault("telemetry", {})["sample_ratio"] = 0.0
    system.config.write_text(yaml.safe_dump(raw))
    try:
        dimmed = reload(system)
        off = trace_settings(system)
        dark = [secrets.token_hex(16) for _ in range(5)]
        for trace_id in dark:
            assert send(system, images, trace_id) is None
    finally:
        system.config.write_text(original)
        restored = reload(system)
    lit = secrets.token_hex(16)
    assert send(system, images, lit) is None
    assert receiver.wait_for(lit, {"strata-gateway"})
    time.sleep(0.5)  # what the other requests would have exported has arrived by now
    assert not [t for t in dark if receiver.trace(t)]
    assert list(dimmed.applied) == ["telemetry.sample_ratio"] and not dimmed.needs_restart
    assert off["trace_level"] == ["OFF"]
    assert list(restored.applied) == ["telemetry.sample_ratio"]
    assert trace_settings(system)["trace_level"] == ["TIMESTAMPS"]
