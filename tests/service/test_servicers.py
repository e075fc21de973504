"""Each servicer in process over real loopback gRPC: answers, errors and their codes.

grpcio-testing drives only synchronous servicers; ours are asyncio servicers, so they run on
real aio servers inside the test process instead (tests/support/inprocess.py).
"""

import asyncio
from collections.abc import Iterator

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.gateway.metrics import UPSTREAM_CALLS
from strata.config import Settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import postprocess_pb2_grpc, preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.wire import codec
from tests.support.inprocess import InProcess, servers_in_process
from tests.support.results import raise_for_result

DIGIT = np.zeros((1, 8, 8), np.uint8)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    with servers_in_process(tmp_path_factory.mktemp("inproc")) as world:
        yield world


@pytest.fixture(scope="module")
def settings(world: InProcess) -> Settings:
    return world.settings


def channel(settings: Settings, service: str) -> grpc.Channel:
    if service == "inference":
        return grpc.insecure_channel(settings.services.primary_inference.listen)
    return grpc.insecure_channel(getattr(settings.services, service).listen)


def request(pipeline: str, rid: str, **arrays: np.ndarray) -> v1.Request:
    return v1.Request(id=rid, pipeline=pipeline, tensors=codec.arrays_to_tensors(arrays))


@pytest.mark.parametrize("service", ["gateway", "preprocess", "inference", "postprocess"])
def test_health_reports_serving(settings: Settings, service: str) -> None:
    stub = health_pb2_grpc.HealthStub(channel(settings, service))
    reply = stub.Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_every_replica_the_config_names_serves_its_own_service(settings: Settings) -> None:
    """The gateway spreads over every replica's address: one left unstarted would hand its
    share to whatever server took that port next."""
    listens = settings.services.preprocess.listens
    assert len(listens) == 2  # the default config's two replicas
    for listen in listens:
        stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(listen))
        reply = stub.Check(health_pb2.HealthCheckRequest(service="strata.v1.Preprocess"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING, listen


def test_preprocess_keeps_each_request_apart(settings: Settings) -> None:
    stub = preprocess_pb2_grpc.PreprocessStub(channel(settings, "preprocess"))
    big = np.full((2, 32, 32), 255, np.uint8)
    reply = stub.Process(
        v1.ProcessRequest(
            requests=[
                request("digits", "ok", images=big),
                request("digits", "bad", images=big.astype(np.float32)),
                request("nope", "lost", images=big),
            ]
        )
    )
    assert [r.id for r in reply.results] == ["ok", "bad", "lost"]
    pixels = raise_for_result(reply.results[0])["pixels"]
    assert pixels.shape == (2, 64) and np.allclose(pixels, 1.0)
    assert reply.results[1].error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "datatype FP32" in reply.results[1].error.message
    assert reply.results[2].error.code == grpc.StatusCode.NOT_FOUND.value[0]


def test_postprocess_turns_logits_into_labels(settings: Settings) -> None:
    stub = postprocess_pb2_grpc.PostprocessStub(channel(settings, "postprocess"))
    logits = np.array([[0, 0, 5, 0, 0, 0, 0, 0, 0, 1]], np.float32)
    reply = stub.Process(v1.ProcessRequest(requests=[request("digits", "a", logits=logits)]))
    outputs = raise_for_result(reply.results[0])
    assert outputs["labels"].tolist() == [[b"2", b"9", b"0"]]
    assert outputs["scores"][0, 0] > 0.9 and np.all(np.diff(outputs["scores"][0]) <= 0)
    missing = stub.Process(v1.ProcessRequest(requests=[request("digits", "b", wrong=logits)]))
    assert "needs tensor 'logits'" in missing.results[0].error.message


def test_inference_describes_and_runs_models(settings: Settings) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channel(settings, "inference"))
    meta = stub.ModelMetadata(v2.ModelMetadataRequest(name="digits"))
    assert [(t.name, list(t.shape)) for t in meta.inputs] == [("pixels", [-1, 64])]
    assert meta.versions == ["1", "2"]
    reply = stub.ModelInfer(codec.build_request("digits", {"pixels": np.zeros((3, 64), "f4")}))
    assert codec.response_outputs(reply)["logits"].shape == (3, 10)
    config = stub.ModelConfig(v2.ModelConfigRequest(name="tabular")).config
    assert config.max_batch_size == 64 and list(config.input[0].dims) == [30]


@pytest.mark.parametrize(
    ("model", "arrays", "code", "words"),
    [
        ("nope", {"pixels": np.zeros((1, 64), "f4")}, "NOT_FOUND", ["'nope'"]),
        ("digits", {"x": np.zeros((1, 64), "f4")}, "INVALID_ARGUMENT", ["pixels", "'x'"]),
        ("digits", {"pixels": np.zeros((1, 63), "f4")}, "INVALID_ARGUMENT", ["[1, 63]"]),
        ("digits", {"pixels": np.zeros((1, 64), "f8")}, "INVALID_ARGUMENT", ["FP64"]),
        ("digits", {"pixels": np.zeros((65, 64), "f4")}, "INVALID_ARGUMENT", ["batch 65"]),
    ],
)
def test_inference_errors(settings: Settings, model, arrays, code, words) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channel(settings, "inference"))
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(codec.build_request(model, arrays))
    assert info.value.code() == getattr(grpc.StatusCode, code)
    for word in words:
        assert word in info.value.details()


def test_gateway_answers_and_refuses_before_any_upstream(settings: Settings) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channel(settings, "gateway"))
    reply = stub.ModelInfer(codec.build_request("digits", {"images": DIGIT}, request_id="r1"))
    assert reply.id == "r1" and reply.model_name == "digits"
    assert [o.name for o in reply.outputs] == ["labels", "scores"]
    asked = codec.build_request("digits", {"images": DIGIT})
    asked.outputs.add(name="scores")
    assert [o.name for o in stub.ModelInfer(asked).outputs] == ["scores"]
    nan = np.full((1, 30), np.nan, np.float32)
    with pytest.raises(grpc.RpcError) as info:
        stub.ModelInfer(codec.build_request("tabular", {"features": nan}))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN" in info.value.details()


class ExpiredCall:
    """What the gateway's handler sees of a call whose deadline has (all but) passed: a
    client-side timeout would end the call before the server answers, whatever it does."""

    def __init__(self, remaining: float) -> None:
        self.remaining = remaining
        self.status: tuple[grpc.StatusCode, str] | None = None

    def time_remaining(self) -> float:
        return self.remaining

    def invocation_metadata(self) -> tuple:
        return ()

    def peer(self) -> str:
        return "ipv4:127.0.0.1:1"

    def peer_identities(self) -> None:  # no client certificate
        return None

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()):
        self.status = (code, details)
        raise grpc.aio.AbortError()


def upstream_calls() -> float:
    """Calls the gateway has made to the layers behind it, in this process."""
    (family,) = UPSTREAM_CALLS.metric.collect()
    return sum(s.value for s in family.samples if s.name.endswith("_total"))


@pytest.mark.parametrize("remaining", [0.0, 1e-6])
def test_gateway_honours_an_expired_deadline(world: InProcess, remaining: float) -> None:
    ((servicer, *_), *_) = world.gateway.registrations
    call = ExpiredCall(remaining)
    before = upstream_calls()
    with pytest.raises(grpc.aio.AbortError):
        world.run(servicer.ModelInfer(codec.build_request("digits", {"images": DIGIT}), call))
    assert call.status is not None and call.status[0] == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "deadline" in call.status[1]
    world.run(asyncio.sleep(0.1))  # a flight it boarded would have left by now
    assert upstream_calls() == before, "a layer was called for a request already out of time"
