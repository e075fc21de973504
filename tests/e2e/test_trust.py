"""Trust and limits, tried as an attacker would against real processes: who may force an arm,
whose answers the cache gives back, who may read the model repository, what a client's
traceparent decides, how much of a client's string comes back, what a long text costs the
tokenizer, and that redaction fails closed."""

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
import requests

from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.security.credentials import key_hash
from strata.telemetry.traces import Receiver
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import ROOT, running_system

OPS = "ops-key-for-the-trust-tests"  # granted force_arm
APP = "app-key-for-the-trust-tests"  # inference only
ADMIN = "inference-admin-token-for-the-trust-tests"
MIB = 1 << 20
LONG_NAME = "a" * MIB
TOKENIZER = ROOT / "build" / "repository" / "minilm" / "1" / "tokenizer.json"
TEXT = {"name": "text", "datatype": "BYTES", "shape": [-1]}
# The redaction of the docs' example, with their rule time limit (0.05 s).
REDACT_EMAIL = {
    **{"kind": "regex_filter", "name": "redact_email", "input": "text", "action": "redact"},
    **{"pattern": r"[\w.+-]+@[\w-]+\.[\w.]+", "timeout_seconds": 0.05},
}
# Only postprocess and preprocess are called with these two, directly (as the gateway would):
# they name a version no repository holds, so no model's signature is checked against them.
NEVER_CALLED = {"name": "digits", "version": "999"}
NOTES = {
    **{"inputs": [TEXT], "outputs": [TEXT], "model": NEVER_CALLED},
    "postprocess": [REDACT_EMAIL],
}
TOKENIZE = {"kind": "tokenize", "input": "text", "tokenizer": "minilm/1/tokenizer.json"}
WORDS = {
    **{"inputs": [TEXT], "outputs": [TEXT], "model": NEVER_CALLED},
    "preprocess": [{**TOKENIZE, "max_length": 256}],
}


def changes() -> dict:
    routes = [
        {"arm": "control", "deployment": "a", "version": "1", "weight": 1},
        {"arm": "canary", "deployment": "b", "version": "2", "weight": 0},  # rolled back
    ]
    keys = [
        {"client_id": "ops", "sha256": key_hash(OPS), "capabilities": ["force_arm"]},
        {"client_id": "app", "sha256": key_hash(APP)},
    ]
    pipelines = {"digits": {"cache": True, "model": {"name": "digits", "routes": routes}}}
    pipelines["notes"] = NOTES
    if TOKENIZER.is_file():
        pipelines["words"] = WORDS
    return {
        "telemetry": {"sample_ratio": 0.0},
        "inference": {"admin_token": ADMIN},
        "gateway": {"api_keys": keys},
        "pipelines": pipelines,
    }


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Supervisor, Receiver]]:
    with Receiver() as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_BSP_SCHEDULE_DELAY": "100",
        }
        folder: Path = tmp_path_factory.mktemp("trust")
        with running_system(folder, changes(), env=env) as system:
            yield system, receiver


@pytest.fixture(scope="module")
def system(traced: tuple[Supervisor, Receiver]) -> Supervisor:
    return traced[0]


def gateway(system: Supervisor) -> v2_grpc.GRPCInferenceServiceStub:
    return v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))


def infer(system: Supervisor, key: str, image: np.ndarray | None = None, **params: str):
    image = np.zeros((1, 8, 8), np.uint8) if image is None else image
    request = codec.build_request("digits", {"images": image})
    for name, value in params.items():
        request.parameters[name].string_param = value
    return gateway(system).ModelInfer(request, metadata=(("x-api-key", key),), timeout=10)


def refusal(call) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value


def arm_of(reply: v2.ModelInferResponse) -> str:
    return reply.parameters["strata.arm"].string_param


# control belongs to those allowed it


def test_only_a_key_granted_force_arm_may_force_an_arm(system: Supervisor) -> None:
    refused = refusal(lambda: infer(system, APP, **{"strata.arm": "control"}))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "'force_arm' capability" in refused.details()
    assert arm_of(infer(system, APP)) == "control", "unforced, the app is answered"
    assert arm_of(infer(system, OPS, **{"strata.arm": "control"})) == "control"
    # The rolled-back arm stays reachable to the operator's key, and to no one else.
    assert arm_of(infer(system, OPS, **{"strata.arm": "canary"})) == "canary"
    refused = refusal(lambda: infer(system, APP, **{"strata.arm": "canary"}))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED


def test_the_cache_tells_a_client_nothing_of_what_others_sent(system: Supervisor) -> None:
    image = np.full((1, 8, 8), 77, np.uint8)
    first = infer(system, OPS, image)
    again = infer(system, OPS, image)
    others = infer(system, APP, image)
    assert not first.parameters["strata.cached"].bool_param
    assert again.parameters["strata.cached"].bool_param, "a client's own answer is cached"
    assert not others.parameters["strata.cached"].bool_param, "not another client's"
    assert infer(system, APP, image).parameters["strata.cached"].bool_param


def test_the_repository_api_needs_the_admin_token_and_names_no_server_path(
    system: Supervisor,
) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("inference-a")))
    index = v2.RepositoryIndexRequest()
    assert refusal(lambda: stub.RepositoryIndex(index)).code() == grpc.StatusCode.UNAUTHENTICATED
    auth = (("authorization", f"Bearer {ADMIN}"),)
    listed = {m.name for m in stub.RepositoryIndex(index, metadata=auth).models}
    assert "digits" in listed
    load = v2.RepositoryModelLoadRequest(model_name="ghost")
    refused = refusal(lambda: stub.RepositoryModelLoad(load, metadata=auth))
    assert refused.code() == grpc.StatusCode.NOT_FOUND
    assert "ghost/" in refused.details()
    assert str(system.settings.repository) not in refused.details()


# a client's traceparent


def test_a_clients_sampled_flag_does_not_sample_but_a_trusted_callers_does(traced) -> None:
    system, receiver = traced
    ignored, followed = secrets.token_hex(16), secrets.token_hex(16)
    request = codec.build_request("digits", {"images": np.zeros((1, 8, 8), np.uint8)})
    gateway(system).ModelInfer(
        request, metadata=(("x-api-key", APP), ("traceparent", traceparent(ignored))), timeout=10
    )
    # Postprocess trusts its caller (here, on the internal network, the test in its place).
    notes = postprocess(system, "notes", b"no address here", traceparent(followed))
    assert not notes.HasField("error"), notes.error.message
    assert receiver.wait_for(followed, {"strata-postprocess"}), "the receiver gets spans"
    time.sleep(1.0)  # every process exports every 0.1 s
    assert receiver.trace(ignored) == [], "sample_ratio 0: the client's -01 samples nothing"


def traceparent(trace_id: str) -> str:
    return f"00-{trace_id}-{secrets.token_hex(8)}-01"


# a client's strings echoed


def bounded(message: str, length: int = MIB) -> None:
    assert len(message.encode()) <= 4096, len(message)
    assert f"({length} characters)" in message, message[:300]


def test_a_mib_model_name_gives_a_bounded_error_everywhere(system: Supervisor) -> None:
    stub, key = gateway(system), (("x-api-key", APP),)
    named = v2.ModelInferRequest(model_name=LONG_NAME)
    calls = {
        "ModelInfer": lambda: stub.ModelInfer(named, metadata=key, timeout=10),
        "ModelMetadata": lambda: stub.ModelMetadata(
            v2.ModelMetadataRequest(name=LONG_NAME), metadata=key, timeout=10
        ),
    }
    for method, call in calls.items():
        refused = refusal(call)
        assert refused.code() == grpc.StatusCode.NOT_FOUND, method
        bounded(refused.details())
    (streamed,) = stub.ModelStreamInfer(iter([named]), metadata=key, timeout=10)
    bounded(streamed.error_message)
    assert len(streamed.infer_response.model_name) <= 129
    # REST's HTTP parser refuses a 1 MiB path before the API sees it; 32 KiB reach it.
    for length, status in ((MIB, 400), (32 * 1024, 404)):
        base = f"http://{system.settings.services.gateway.rest}/v2/models/{'a' * length}"
        headers = {"x-api-key": APP}
        for answer in (
            requests.post(f"{base}/infer", json={"inputs": []}, headers=headers, timeout=10),
            requests.get(base, headers=headers, timeout=10),
        ):
            assert answer.status_code == status, answer.text[:300]
            assert len(answer.content) <= 4096 + 16
            if status == 404:
                bounded(answer.json()["error"], length)
    rest = system.settings.services.gateway.rest
    unrouted = requests.get(f"http://{rest}/v2/{'a' * 32 * 1024}", timeout=10)
    assert unrouted.status_code == 404
    assert len(unrouted.content) <= 4096 and "(32772 characters)" in unrouted.text
    lines = [
        line for path in system.log_dir.glob("*.log") for line in path.read_bytes().splitlines()
    ]
    assert max(map(len, lines)) <= 16 * 1024


# what a text costs, and redaction


def text_tensor(*texts: bytes) -> list[v1.Tensor]:
    items = np.empty(len(texts), dtype=object)
    items[:] = list(texts)
    return codec.arrays_to_tensors({"text": items})


def postprocess(system: Supervisor, pipeline: str, text: bytes, parent: str = "") -> v1.Result:
    channel = grpc.insecure_channel(system.address("postprocess"))
    stub = postprocess_pb2_grpc.PostprocessStub(channel)
    call = v1.ProcessRequest(requests=[v1.Request(pipeline=pipeline, tensors=text_tensor(text))])
    metadata = (("traceparent", parent),) if parent else ()
    return stub.Process(call, metadata=metadata, timeout=30).results[0]


def test_a_redaction_that_overruns_refuses_the_answer(system: Supervisor) -> None:
    text = b"lorem ipsum " * 300_000 + b"write to someone@example.com"  # 3.6 MB
    refused = postprocess(system, "notes", text)
    assert refused.error.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "'redact_email' (0.05s)" in refused.error.message
    assert not refused.tensors, "nothing goes out unredacted"
    redacted = postprocess(system, "notes", b"write to someone@example.com")
    assert codec.tensors_to_arrays(redacted.tensors)["text"].tolist() == [b"write to ***"]


@pytest.mark.skipif(not TOKENIZER.is_file(), reason="the minilm tokenizer is not built")
def test_a_long_text_costs_the_tokenizer_what_max_length_allows(system: Supervisor) -> None:
    stub = preprocess_pb2_grpc.PreprocessStub(grpc.insecure_channel(system.address("preprocess-0")))
    # 12 texts of 1 MiB (the most one element may hold): seconds of encoding if read whole.
    texts = [b"word " * (MIB // 5)] * 12
    call = v1.ProcessRequest(requests=[v1.Request(pipeline="words", tensors=text_tensor(*texts))])
    # The preprocess process's CPU, not the wall clock: a loaded machine stretches the one,
    # not the other.
    preprocess = psutil.Process(system.processes["preprocess-0"].pid)
    before = sum(preprocess.cpu_times()[:2])  # user, system
    (result,) = stub.Process(call, timeout=30).results
    seconds = sum(preprocess.cpu_times()[:2]) - before
    assert not result.HasField("error"), result.error.message
    ids = codec.tensors_to_arrays(result.tensors)["input_ids"]
    assert ids.shape == (12, 256) and seconds < 2.0, seconds
