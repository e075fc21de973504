"""Identity is what was authenticated: with client certificates required at the gateway
(tls.client_certificates) and no API keys, a client's rate-limit bucket is its certificate's,
on gRPC and REST alike, and naming another client in x-client-id reaches no one else's."""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from scripts.make_certs import CLIENT_FOLDER, make_certs
from strata.config.tls import CA, CERT, KEY
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import running_system

CLIENTS = ("tenant-a", "tenant-b")
BURST = 2  # each client's bucket, refilled too slowly to matter here
PUBLIC = "gateway-public"
IMAGE = np.zeros((1, 8, 8), np.uint8)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("certs")
    make_certs(folder, clients=CLIENTS)
    return folder


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, certs: Path) -> Iterator[Supervisor]:
    changes = {
        "tls": {
            "enabled": True,
            "certs": str(certs),
            "server_name": "localhost",
            "client_certificates": True,
        },
        "gateway": {"rate_limits": {"per_client": {"rate": 0.001, "burst": BURST}}},
    }
    with running_system(tmp_path_factory.mktemp("identity"), changes) as supervisor:
        yield supervisor


def channel(system: Supervisor, certs: Path, client: str | None) -> grpc.Channel:
    """A channel to the gateway, presenting `client`'s certificate (none for None)."""
    root = (certs / PUBLIC / CA).read_bytes()
    presented = {}
    if client is not None:
        folder = certs / CLIENT_FOLDER / client
        presented = {
            "private_key": (folder / KEY).read_bytes(),
            "certificate_chain": (folder / CERT).read_bytes(),
        }
    credentials = grpc.ssl_channel_credentials(root, **presented)
    options = [("grpc.ssl_target_name_override", "localhost")]
    return grpc.secure_channel(system.address("gateway"), credentials, options)


def infer(system: Supervisor, certs: Path, client: str | None, named: str = "") -> grpc.StatusCode:
    """One ModelInfer as `client`, naming `named` in x-client-id; its status code."""
    metadata = (("x-client-id", named),) if named else ()
    with channel(system, certs, client) as open_channel:
        stub = v2_grpc.GRPCInferenceServiceStub(open_channel)
        request = codec.build_request("digits", {"images": IMAGE})
        try:
            stub.ModelInfer(request, metadata=metadata, timeout=10)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def rest_infer(system: Supervisor, certs: Path, client: str, named: str = "") -> int:
    """One REST inference as `client`, naming `named` in x-client-id; its HTTP status."""
    context = ssl.create_default_context(cafile=certs / PUBLIC / CA)
    folder = certs / CLIENT_FOLDER / client
    context.load_cert_chain(folder / CERT, folder / KEY)
    port = system.settings.services.gateway.rest.rpartition(":")[2]
    connection = http.client.HTTPSConnection("localhost", int(port), context=context, timeout=10)
    tensor = {"name": "images", "shape": [1, 8, 8], "datatype": "UINT8", "data": [0] * 64}
    body = {"inputs": [tensor]}
    headers = {"content-type": "application/json", **({"x-client-id": named} if named else {})}
    try:
        connection.request("POST", "/v2/models/digits/infer", json.dumps(body), headers)
        return connection.getresponse().status
    finally:
        connection.close()


def test_a_client_without_a_certificate_is_not_let_in(system: Supervisor, certs: Path) -> None:
    assert infer(system, certs, None) == grpc.StatusCode.UNAVAILABLE


def test_naming_another_client_uses_only_ones_own_bucket(system: Supervisor, certs: Path) -> None:
    a, b = CLIENTS
    # a empties its own bucket while naming b, then a fresh name does not refill it.
    assert [infer(system, certs, a, named=b) for _ in range(BURST)] == [grpc.StatusCode.OK] * 2
    assert infer(system, certs, a, named="someone-new") == grpc.StatusCode.RESOURCE_EXHAUSTED
    # b's bucket is whole, on REST as on gRPC: the certificate names the bucket, not a header.
    assert rest_infer(system, certs, b, named=a) == 200
    assert infer(system, certs, b) == grpc.StatusCode.OK
    assert rest_infer(system, certs, b) == 429


def test_the_door_is_not_called_open(system: Supervisor) -> None:
    assert "the door is open" not in (system.log_dir / "gateway.log").read_text()
