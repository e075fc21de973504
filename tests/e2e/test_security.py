"""TLS on every hop, a certificate per identity, callers admitted by identity, API keys at the
gateway, health checks and probes that work with TLS on, and no secret in the logs."""

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from scripts.make_certs import make_certs
from strata.config.tls import CA, CERT, KEY, TlsSettings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.security.credentials import key_hash
from strata.tools import admin_client as strata_admin
from strata.tools import healthcheck
from strata.tools.launch import ROOT, Supervisor, wait_serving
from strata.wire import codec
from tests.support.system import free_port, running_system

KEY_VALUE = "s3cret-api-key-for-tests"
ADMIN_TOKEN = "admin-token-for-the-tls-tests-32-chars-or-more"
IMAGE = np.zeros((1, 8, 8), np.uint8)
PUBLIC = "gateway-public"
# Each internal instance, its identity, and one of its own RPCs.
INTERNAL = {
    "preprocess-0": ("preprocess", "/strata.v1.Preprocess/Process"),
    "inference-a": ("inference", "/inference.GRPCInferenceService/RepositoryIndex"),
    "postprocess": ("postprocess", "/strata.v1.Postprocess/Process"),
}
UNLOAD = "/inference.GRPCInferenceService/RepositoryModelUnload"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder)
    return folder


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[Supervisor]:
    changes = {
        # Every certificate names localhost; an `ipv4:` target of replicas names no one host.
        "tls": {"enabled": True, "certs": str(certs), "server_name": "localhost"},
        "gateway": {
            "api_keys": [{"client_id": "alice", "sha256": key_hash(KEY_VALUE)}],
            "admin_token": ADMIN_TOKEN,
        },
        "services": {"gateway": {"admin_listen": f"127.0.0.1:{free_port()}"}},
    }
    with running_system(tmp_path_factory.mktemp("secure"), changes) as supervisor:
        yield supervisor


def secure(address: str, certs: Path, identity: str | None = None) -> grpc.Channel:
    """A channel trusting the CA of `certs`, presenting `identity`'s certificate if given."""
    presented = {}
    if identity is not None:
        presented = {
            "private_key": (certs / identity / KEY).read_bytes(),
            "certificate_chain": (certs / identity / CERT).read_bytes(),
        }
    root = (certs / (identity or PUBLIC) / CA).read_bytes()
    return grpc.secure_channel(address, grpc.ssl_channel_credentials(root, **presented))


def infer(channel: grpc.Channel, metadata=()) -> object:
    stub = v2_grpc.GRPCInferenceServiceStub(channel)
    return stub.ModelInfer(
        codec.build_request("digits", {"images": IMAGE}), metadata=metadata, timeout=10
    )


def health(channel: grpc.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    return stub.Check(health_pb2.HealthCheckRequest(), timeout=5).status


def call(channel: grpc.Channel, method: str, request: bytes = b"") -> bytes:
    """An RPC by name with a raw (serialized) request: what it does matters less than who asks."""
    return channel.unary_unary(method)(request, timeout=5)


def certificate_name(address: str, certs: Path) -> str:
    """The common name of the certificate the server at `address` presents."""
    context = ssl.create_default_context(cafile=certs / PUBLIC / CA)
    context.load_cert_chain(certs / "gateway" / CERT, certs / "gateway" / KEY)
    context.set_alpn_protocols(["h2"])
    host, _, port = address.rpartition(":")
    with (
        socket.create_connection((host, int(port)), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=host) as wrapped,
    ):
        cert = x509.load_der_x509_certificate(wrapped.getpeercert(binary_form=True))
    return cert.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value


def test_a_client_with_a_key_gets_answers_over_tls(system: Supervisor, certs: Path) -> None:
    reply = infer(secure(system.address("gateway"), certs), (("x-api-key", KEY_VALUE),))
    assert [o.name for o in reply.outputs] == ["labels", "scores"]


def test_the_admin_port_speaks_tls_with_the_public_certificate(
    system: Supervisor, certs: Path
) -> None:
    address = system.settings.services.gateway.admin_listen
    assert certificate_name(address, certs) == PUBLIC
    admin = admin_pb2_grpc.AdminStub(secure(address, certs))
    metadata = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
    assert admin.Status(admin_pb2.StatusRequest(), metadata=metadata, timeout=5).pipelines
    with pytest.raises(grpc.RpcError) as info:
        admin.Status(admin_pb2.StatusRequest(), timeout=5)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_each_server_presents_its_own_identity(system: Supervisor, certs: Path) -> None:
    assert certificate_name(system.address("gateway"), certs) == PUBLIC
    for name, (identity, _) in INTERNAL.items():
        assert certificate_name(system.address(name), certs) == identity, name


@pytest.mark.parametrize("metadata", [(), (("x-api-key", "wrong-key"),)])
def test_no_valid_key_is_unauthenticated(system: Supervisor, certs: Path, metadata) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(secure(system.address("gateway"), certs), metadata)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "x-api-key" in info.value.details() and "wrong-key" not in info.value.details()


def test_plaintext_is_refused(system: Supervisor) -> None:
    with pytest.raises(grpc.RpcError) as info:
        infer(grpc.insecure_channel(system.address("gateway")), (("x-api-key", KEY_VALUE),))
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE


def test_internal_services_require_a_client_certificate(system: Supervisor, certs: Path) -> None:
    for name in INTERNAL:
        address = system.address(name)
        with pytest.raises(grpc.RpcError) as info:
            health(secure(address, certs))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name
        with pytest.raises(grpc.RpcError) as info:
            health(grpc.insecure_channel(address))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name
        assert health(secure(address, certs, "gateway")) == health_pb2.HealthCheckResponse.SERVING


def test_a_certificate_from_another_ca_is_refused(
    system: Supervisor, tmp_path_factory: pytest.TempPathFactory
) -> None:
    stranger = tmp_path_factory.mktemp("stranger")
    make_certs(stranger)
    for name in INTERNAL:
        with pytest.raises(grpc.RpcError) as info:
            health(secure(system.address(name), stranger, "gateway"))
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE, name


def test_only_the_gateway_may_call_the_layers(system: Supervisor, certs: Path) -> None:
    for name, (_, method) in INTERNAL.items():
        address = system.address(name)
        for wrong in ("preprocess", "inference", "postprocess"):
            with pytest.raises(grpc.RpcError) as info:
                call(secure(address, certs, wrong), method)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED, (name, wrong)
            details = info.value.details()
            assert "admits only callers ['gateway']" in details and f"strata/{wrong}" in details
            # A layer's health is open to any certificate of the CA: containers check their own.
            assert health(secure(address, certs, wrong)) == health_pb2.HealthCheckResponse.SERVING


def test_a_layer_cannot_unload_a_model(system: Supervisor, certs: Path) -> None:
    unload = v2.RepositoryModelUnloadRequest(model_name="digits").SerializeToString()
    with pytest.raises(grpc.RpcError) as info:
        call(secure(system.address("inference-a"), certs, "preprocess"), UNLOAD, unload)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    reply = infer(secure(system.address("gateway"), certs), (("x-api-key", KEY_VALUE),))
    assert reply.outputs, "digits still serves"


def test_the_health_check_tool_speaks_tls(system: Supervisor, certs: Path) -> None:
    config = str(system.config)
    for name, (identity, _) in [*INTERNAL.items(), ("gateway", ("gateway", ""))]:
        argv = [system.address(name), "--config", config, "--identity", identity]
        assert healthcheck.main(argv) == 0, name
    assert healthcheck.main([system.address("inference-a")]) == 1, "plaintext never connects"


def test_probes_without_a_certificate_use_the_plaintext_probe_port(
    system: Supervisor, tmp_path: Path
) -> None:
    listen, probe = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "services.postprocess", "--config", str(system.config)]
    env = {**os.environ, "STRATA_TLS__PROBE_LISTEN": probe}
    with open(tmp_path / "postprocess.log", "wb") as log:
        process = subprocess.Popen(
            [*command, "--listen", listen], cwd=ROOT, env=env, stdout=log, stderr=log
        )
    try:
        assert wait_serving(probe, 60, TlsSettings()), (tmp_path / "postprocess.log").read_text()
        with pytest.raises(grpc.RpcError) as info:
            call(grpc.insecure_channel(probe), INTERNAL["postprocess"][1])
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, "the probe port has health only"
        with pytest.raises(grpc.RpcError):
            health(grpc.insecure_channel(listen))
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0


def test_secrets_never_reach_the_logs(system: Supervisor, certs: Path) -> None:
    with pytest.raises(grpc.RpcError):
        infer(secure(system.address("gateway"), certs), (("x-api-key", "wrong-key"),))
    infer(secure(system.address("gateway"), certs), (("x-api-key", KEY_VALUE),))
    logs = "".join(path.read_text() for path in system.log_dir.glob("*.log"))
    assert KEY_VALUE not in logs and "wrong-key" not in logs and ADMIN_TOKEN not in logs


def test_strata_admin_speaks_tls_to_the_admin_port(
    system: Supervisor, capsys: pytest.CaptureFixture
) -> None:
    assert strata_admin.main(["--config", str(system.config), "--json", "status"]) == 0
    assert "digits" in json.loads(capsys.readouterr().out)["pipelines"]
