"""TLS settings and the caller check, without running servers (tests/e2e/test_security.py runs
them): what the config refuses, what a missing certificate says, and which servers check."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from scripts.make_certs import make_certs
from strata.config.tls import CERT, TlsSettings
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.security.credentials import caller_guard, server_credentials
from strata.tools import healthcheck
from tests.support.system import make_config

INFERENCE = "inference.GRPCInferenceService"


def test_tls_on_needs_the_certificate_folder() -> None:
    with pytest.raises(ValidationError, match="certs"):
        TlsSettings(enabled=True)


def test_a_relative_folder_resolves_against_the_config(tmp_path: Path) -> None:
    tls = TlsSettings(enabled=True, certs=Path("certs")).resolved(tmp_path)
    assert tls.certs == tmp_path / "certs"


def test_internal_layers_admit_the_gateway_by_default() -> None:
    assert TlsSettings().allowed_clients == {
        "preprocess": ["gateway"],
        "inference": ["gateway"],
        "postprocess": ["gateway"],
    }


def test_a_missing_certificate_names_the_identity_and_the_fix(tmp_path: Path) -> None:
    tls = TlsSettings(enabled=True, certs=tmp_path)
    with pytest.raises(OSError, match=r"TLS identity 'preprocess'.*preprocess/tls.key.*make certs"):
        server_credentials(tls, "preprocess", public=False)


def test_the_health_check_tool_reports_a_missing_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    make_certs(tmp_path / "certs")
    (tmp_path / "certs" / "gateway" / CERT).unlink()
    config = make_config(tmp_path, {"tls": {"enabled": True, "certs": str(tmp_path / "certs")}})
    assert healthcheck.main(["127.0.0.1:1", "--config", str(config)]) == 1
    assert "TLS identity 'gateway'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("enabled", "public"), [(False, False), (True, True)], ids=["plaintext", "public"]
)
def test_only_internal_servers_under_tls_check_callers(enabled: bool, public: bool) -> None:
    servicer = object()
    guard = caller_guard(TlsSettings(enabled=enabled, certs=Path("c")), "gateway", public)
    assert guard(servicer, INFERENCE) is servicer


def test_a_layer_no_one_may_call_says_so(caplog: pytest.LogCaptureFixture) -> None:
    tls = TlsSettings(enabled=True, certs=Path("c"), allowed_clients={})
    servicer = v2_grpc.GRPCInferenceServiceServicer()
    guarded = caller_guard(tls, "inference", public=False)(servicer, INFERENCE)
    assert guarded is not servicer and callable(guarded.ModelInfer)
    assert "inference admits no callers" in caplog.text
