"""The admin API and client keys with their secrets in files, against real processes: the
admin API on a port of its own (not on the public one, nor in its reflection), tokens and
keys rotated by a config reload, wrong admin tokens throttled and logged with the caller's
address, and a gateway without keys saying at start that its door is open."""

from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from strata.config import load_settings
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.proto.v1 import admin_pb2, admin_pb2_grpc
from strata.security.bearer import FAILURES
from strata.security.credentials import key_hash
from strata.tools.launch import Supervisor
from strata.wire import codec
from tests.support.system import free_port, make_config, running_system

TOKEN = "first-admin-token-of-32-characters-or-more"
ROTATED = "second-admin-token-of-32-characters-or-more"
KEY, NEW_KEY = "alice-key-for-tests", "bob-key-for-tests"
IMAGE = np.zeros((1, 8, 8), np.uint8)
ADMIN_SERVICE = "strata.v1.Admin"


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("secrets")
    (folder / "admin-token").write_text(TOKEN + "\n")
    keys = [{"client_id": "alice", "sha256": key_hash(KEY)}]
    (folder / "api-keys.yaml").write_text(yaml.safe_dump(keys))
    return folder


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory, secrets: Path) -> Iterator[Supervisor]:
    changes = {
        "services": {"gateway": {"admin_listen": f"127.0.0.1:{free_port()}"}},
        "gateway": {
            "admin_token_file": str(secrets / "admin-token"),
            "api_keys_file": str(secrets / "api-keys.yaml"),
        },
    }
    with running_system(tmp_path_factory.mktemp("admin"), changes) as supervisor:
        yield supervisor


def admin(system: Supervisor) -> admin_pb2_grpc.AdminStub:
    address = system.settings.services.gateway.admin_listen
    return admin_pb2_grpc.AdminStub(grpc.insecure_channel(address))


def infer(system: Supervisor, key: str) -> grpc.StatusCode:
    stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    request = codec.build_request("digits", {"images": IMAGE})
    try:
        stub.ModelInfer(request, metadata=(("x-api-key", key),), timeout=10)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def status_code(stub: admin_pb2_grpc.AdminStub, token: str) -> grpc.StatusCode:
    try:
        stub.Status(admin_pb2.StatusRequest(), metadata=bearer(token), timeout=5)
    except grpc.RpcError as exc:
        return exc.code()
    return grpc.StatusCode.OK


def listed_services(address: str) -> set[str]:
    stub = reflection_pb2_grpc.ServerReflectionStub(grpc.insecure_channel(address))
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    (reply,) = stub.ServerReflectionInfo(iter([request]), timeout=5)
    return {s.name for s in reply.list_services_response.service}


def gateway_log(system: Supervisor) -> str:
    return (system.log_dir / "gateway.log").read_text()


def test_the_admin_api_is_on_its_own_port_only(system: Supervisor) -> None:
    assert status_code(admin(system), TOKEN) == grpc.StatusCode.OK
    public = admin_pb2_grpc.AdminStub(grpc.insecure_channel(system.address("gateway")))
    assert status_code(public, TOKEN) == grpc.StatusCode.UNIMPLEMENTED
    assert ADMIN_SERVICE not in listed_services(system.address("gateway"))
    assert ADMIN_SERVICE in listed_services(system.settings.services.gateway.admin_listen)


def test_repository_control_stays_off_the_public_port_with_the_admin_api(
    system: Supervisor,
) -> None:
    """The admin token is never checked on the public port, not even by Triton's calls."""
    public = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
    with pytest.raises(grpc.RpcError) as refused:
        public.RepositoryIndex(v2.RepositoryIndexRequest(), metadata=bearer(TOKEN), timeout=5)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "services.gateway.admin_listen" in refused.value.details()


def test_keys_come_from_their_file_and_the_door_is_not_called_open(system: Supervisor) -> None:
    assert infer(system, KEY) == grpc.StatusCode.OK
    assert infer(system, NEW_KEY) == grpc.StatusCode.UNAUTHENTICATED
    assert "the door is open" not in gateway_log(system)


def test_rotated_files_apply_at_reload(system: Supervisor, secrets: Path) -> None:
    keys = yaml.safe_load((secrets / "api-keys.yaml").read_text())
    keys.append({"client_id": "bob", "sha256": key_hash(NEW_KEY)})
    (secrets / "api-keys.yaml").write_text(yaml.safe_dump(keys))
    (secrets / "admin-token").write_text(ROTATED)
    stub = admin(system)
    reply = stub.Reload(admin_pb2.ReloadRequest(), metadata=bearer(TOKEN), timeout=10)
    assert set(reply.applied) == {"gateway.admin_token", "gateway.api_keys"}
    assert not reply.needs_restart
    assert status_code(stub, ROTATED) == grpc.StatusCode.OK
    assert status_code(stub, TOKEN) == grpc.StatusCode.UNAUTHENTICATED
    assert infer(system, NEW_KEY) == grpc.StatusCode.OK
    assert ROTATED not in gateway_log(system) and TOKEN not in gateway_log(system)


def test_fifty_wrong_admin_tokens_are_throttled(system: Supervisor) -> None:
    # Last in the module: it leaves this address refused for the backoff.
    stub = admin(system)
    codes = [status_code(stub, f"guess-{i:02d}-" + "x" * 32) for i in range(50)]
    wrong = FAILURES - 1  # the rotation test failed once already, from the same address
    assert codes[:wrong] == [grpc.StatusCode.UNAUTHENTICATED] * wrong
    assert codes[wrong:] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * (50 - wrong)
    assert status_code(stub, ROTATED) == grpc.StatusCode.RESOURCE_EXHAUSTED, "not even checked"
    lines = gateway_log(system).splitlines()
    warnings = [line for line in lines if "wrong admin token from ipv4:127.0.0.1" in line]
    assert len(warnings) == FAILURES and all('"WARNING"' in line for line in warnings)
    assert "guess-" not in gateway_log(system)


def test_a_gateway_without_keys_says_its_door_is_open(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    supervisor = Supervisor(config, load_settings(config), log_dir=tmp_path)
    supervisor.start("gateway")
    try:
        lines = (tmp_path / "gateway.log").read_text().splitlines()
    finally:
        supervisor.stop_all()
    opened = [line for line in lines if "the door is open" in line]
    assert len(opened) == 1 and '"WARNING"' in opened[0] and "x-client-id" in opened[0]
