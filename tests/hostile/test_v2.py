"""Hostile v2 calls at the gateway and at each inference instance, while a good request to
the same port keeps its normal latency: ModelInfer (flight parameters too), the calls that
name a model and a version, the repository extension, and streams. Every answer is OK or a
client's error with a message; never INTERNAL, UNKNOWN or a hang; every process stays up."""

from __future__ import annotations

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from strata.models import repository
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire.flight import TIMEOUTS
from tests.support.hostile import (
    CLIENT,
    CONTROL,
    S,
    answer,
    hostile_names,
    share,
    v2_requests,
    versions,
)
from tests.support.ports import kind, named, ports, watched

# Every attack is judged by how late an honest request meanwhile is: run alone.
pytestmark = pytest.mark.timing

V2_PORTS = ports("gateway", "inference")
MODELS = {
    "gateway": (["digits", "tabular", "nope", ""], ["images", "features", "text"]),
    "inference": (["digits", "tabular"], ["pixels", "features"]),
}
READS = {
    "gateway": ["ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig"],
    "inference": ["ModelInfer", "ModelReady", "ModelMetadata", "ModelConfig", "ModelStatistics"],
}
REPOSITORY = ["RepositoryModelLoad", "RepositoryModelUnload", "RepositoryIndex"]


def allowed(port: str, requests: list[v2.ModelInferRequest]) -> frozenset[S]:
    """A request's own time budget at inference may run out: that is its answer then."""
    timed = any({"timeout", TIMEOUTS} & set(r.parameters) for r in requests)
    return CLIENT | {S.DEADLINE_EXCEEDED} if timed and kind(port) == "inference" else CLIENT


@pytest.mark.parametrize("port", V2_PORTS)
def test_hostile_model_infer(system: Supervisor, channels: dict, port: str) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channels[port])

    @share(0.4)
    @given(request=v2_requests(*MODELS[kind(port)]))
    def hostile(request: v2.ModelInferRequest) -> None:
        answer(lambda: stub.ModelInfer(request, timeout=15), allowed(port, [request]))

    with watched(system, channels[port], port):
        hostile()


@pytest.mark.parametrize("port", V2_PORTS)
def test_hostile_model_names_and_versions(system: Supervisor, channels: dict, port: str) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channels[port])
    # Loading or unloading a model the deployment serves is not hostile input, it is an
    # outage; nor is loading one the repository holds but nobody asked for (MiniLM's 90 MB).
    held = set(repository.models(system.settings.repository))
    reads = st.tuples(
        st.sampled_from(READS[kind(port)]),
        st.one_of(st.sampled_from(["digits", "tabular"]), hostile_names),
        versions,
    )
    unheld = hostile_names.filter(lambda name: name not in held)
    repository_calls = st.tuples(st.sampled_from(REPOSITORY), unheld, st.just(""))
    calls = st.one_of(reads, repository_calls) if kind(port) == "inference" else reads

    @share(0.3)
    @given(call=calls)
    def hostile(call: tuple[str, str, str]) -> None:
        method, name, version = call
        codes = CONTROL if method in REPOSITORY else CLIENT
        answer(lambda: getattr(stub, method)(named(method, name, version), timeout=15), codes)

    with watched(system, channels[port], port):
        hostile()


@pytest.mark.parametrize("port", V2_PORTS)
def test_hostile_streams(system: Supervisor, channels: dict, port: str) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channels[port])

    @share(0.1)
    @given(requests=st.lists(v2_requests(*MODELS[kind(port)]), min_size=1, max_size=4))
    def hostile(requests: list[v2.ModelInferRequest]) -> None:
        codes = allowed(port, requests)
        replies, _ = answer(lambda: list(stub.ModelStreamInfer(iter(requests), timeout=15)), codes)
        if replies is None:
            return
        assert len(replies) == len(requests), "one answer per request of the stream"
        for reply in replies:
            if reply.error_message:
                code = getattr(S, reply.error_message.split(":")[0], S.UNKNOWN)
                assert code in codes and code != S.OK, reply.error_message

    with watched(system, channels[port], port):
        hostile()


def test_the_gateway_unloads_nothing_for_an_anonymous_client(channels: dict) -> None:
    stub = v2_grpc.GRPCInferenceServiceStub(channels["gateway"])
    with pytest.raises(grpc.RpcError) as info:
        stub.RepositoryModelUnload(v2.RepositoryModelUnloadRequest(model_name="digits"), timeout=5)
    assert info.value.code() in {S.UNIMPLEMENTED, S.UNAUTHENTICATED, S.PERMISSION_DENIED}
