"""TLS on every hop, mutual TLS inside, API keys at the gateway, and no secret in the logs."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts.make_certs import make_certs
from strata import codec
from strata.launch import Supervisor
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.security import key_hash
from tests.support.system import running_system

KEY = "s3cret-api-key-for-tests"
IMAGE = np.zeros((1, 8, 8), np.uint8)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder)
    return folder


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[Supervisor]:
    changes = {
        "tls": {
            "enabled": True,
            "ca": str(certs / "ca.pem"),
            "cert": str(certs / "server.pem"),
            "key": str(certs / "server-key.pem"),
            "client_cert": str(certs / "client.pem"),
            "client_key": str(certs / "client-key.pem"),
            "server_name": "localhost",
        },
        "gateway": {"api_keys": [{"client_id": "alice", "sha256": key_hash(KEY)}]},
    }
    with running_system(tmp_path_factory.mktemp("secure"), changes) as supervisor:
        yield supervisor


def secure(address: str, certs: Path, client_cert: bool = False) -> grpc.Channel:
    identity = {}
    if client_cert:
        identity = {
            "private_key": (certs / "client-key.pem").read_bytes(),
            "certificate_chain": (certs / "client.pem").read_bytes(),
        }
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes(), **identity)
    options = [("grpc.ssl_target_name_override", "localhost")]
    return grpc.secure_channel(address, credentials, options=options)


def infer(channel: grpc.Channel, metadata=()) -> object:
    stub = v2_grpc.GRPCInferenceServiceStub(channel)
    return stub.ModelInfer(
        codec.build_request("digits", {"images": IMAGE}), metadata=metadata, timeout=10
    )


def test_a_client_with_a_key_gets_answers_over_tls(system: Supervisor, certs: Path) -> None:
    reply = infer(secure(system.address("gateway"), certs), (("x-api-key", KEY),))
    assert [o.name for o in reply.outputs] == ["labels", "scores"]


@pytest.mark.parametrize("metadata", [(), (("x-api-key", "wrong-key"),)])
def test_no_valid_key_is_unauthenticated(system: Supervisor, certs: Path, metadata) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(secure(system.address("gateway"), certs), metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "x-api-key" in info.value.details() and "wrong-key" not in info.value.details()


def test_plaintext_is_refused(system: Supervisor) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(grpc.insecure_channel(system.address("gateway")), (("x-api-key", KEY),))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def test_internal_services_require_a_client_certificate(system: Supervisor, certs: Path) -> None:
    for name in ("preprocess-0", "inference-a", "postprocess"):
        address = system.address(name)
        with pytest.raises(grpc.RpcError) as info:
            health(secure(address, certs))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name
        assert health(secure(address, certs, client_cert=True)) == 1, name  # SERVING


def test_secrets_never_reach_the_logs(system: Supervisor, certs: Path) -> None:
    with pytest.raises(grpc.RpcError):
        infer(secure(system.address("gateway"), certs), (("x-api-key", "wrong-key"),))
    infer(secure(system.address("gateway"), certs), (("x-api-key", KEY),))
    logs = "".join(path.read_text() for path in system.log_dir.glob("*.log"))
    assert KEY not in logs and "wrong-key" not in logs
