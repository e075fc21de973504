"""X-Forwarded-For is believed only from the proxies gateway.rest.forwarded_allow_ips names:
by default a caller on loopback cannot pose as other addresses to escape its peer's bucket."""

from pathlib import Path

import pytest
import requests

from strata.config import load_settings
from strata.tools.launch import Supervisor
from tests.support.system import make_config

# One peer may send one request (burst 1, and the peer's bucket is one client's).
LIMITS = {"per_client": {"rate": 0.01, "burst": 1}, "peer_clients": 1}
BODY = {"inputs": [{"name": "images", "datatype": "UINT8", "shape": [1, 8, 8], "data": [0] * 64}]}


def statuses(tmp_path: Path, rest: dict) -> list[int]:
    """The gateway alone (no layers: admission answers first), asked twice from loopback
    as two clients forwarded for two addresses."""
    # No layer is started, so a request the door lets through waits for preprocess to come up
    # (wait-for-ready) until its deadline: keep that short, the test is about the door.
    changes = {"gateway": {"rate_limits": LIMITS, "rest": rest, "default_timeout_seconds": 1}}
    config = make_config(tmp_path, changes)
    settings = load_settings(config)
    supervisor = Supervisor(config, settings, log_dir=tmp_path)
    supervisor.start("gateway")
    url = f"http://{settings.services.gateway.rest}/v2/models/digits/infer"
    try:
        return [
            requests.post(
                url,
                json=BODY,
                headers={"x-client-id": f"client-{i}", "x-forwarded-for": f"203.0.113.{i}"},
                timeout=10,
            ).status_code
            for i in (1, 2)
        ]
    finally:
        supervisor.stop_all()


def test_forwarded_addresses_are_ignored_by_default(tmp_path: Path) -> None:
    assert statuses(tmp_path, {})[1] == 429, "both requests are loopback's: one bucket"


@pytest.mark.parametrize("proxies", [["127.0.0.1"], ["127.0.0.0/8"]])
def test_a_configured_proxy_forwards_the_callers_address(tmp_path: Path, proxies) -> None:
    assert statuses(tmp_path, {"forwarded_allow_ips": proxies})[1] != 429
