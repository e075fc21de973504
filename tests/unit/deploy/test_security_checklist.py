"""docs/security.md's hardening checklist, held true for every shipped deploy: the container
config (configs/compose.yaml, which compose mounts and Kubernetes makes ConfigMap
strata-config), the compose file, and each Kubernetes overlay as kustomize renders it.

Each numbered test is a checklist item; docs/security.md names them in the same order.
"""

from __future__ import annotations

import ipaddress
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from scripts.make_certs import ADMIN_SECRET, IDENTITIES, KEYS_SECRET, make_certs
from strata.config import load_settings
from strata.config.base import MIN_ADMIN_TOKEN
from strata.config.tls import KEY
from strata.security.credentials import KeyRing
from tests.e2e.test_deploy_entry import loopback_config
from tests.unit.deploy.test_deploy import (
    COMPOSE_CONFIG,
    ROOT,
    container_settings,
    load_compose,
    port_of,
    strata_services,
)
from tests.unit.deploy.test_deploy_k8s import K8S, OVERLAYS, container, strata_workloads
from tests.unit.deploy.test_deploy_kustomize import Resource, build, pod_containers

CHECKLIST = ROOT / "docs" / "security.md"


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest) -> list[Resource]:
    return build(K8S / "overlays" / request.param)


def pods(resources: list[Resource]) -> list[tuple[str, dict[str, Any]]]:
    """(name, pod spec) of every workload."""
    return [
        (r["metadata"]["name"], r["spec"]["template"]["spec"])
        for r in resources
        if r["kind"] == "Deployment"
    ]


def test_1_clients_need_an_api_key(tmp_path: Path) -> None:
    gateway = container_settings().gateway
    assert gateway.api_keys_file is not None, "keys come from a mounted secret file"
    # Started as the gateway starts, with the files `make certs` writes: the door is closed.
    config, _ = loopback_config(tmp_path)
    started = load_settings(config, "gateway").gateway
    assert KeyRing(started.api_keys), "a gateway with no key serves anyone"


def test_2_every_client_and_the_whole_are_rate_limited() -> None:
    limits = container_settings().gateway.rate_limits
    assert limits.per_client is not None and limits.total is not None


def test_3_the_admin_api_is_internal_only(overlay: list[Resource]) -> None:
    gateway = container_settings().services.gateway
    assert gateway.admin_listen is not None, "not on the public port"
    host = gateway.admin_listen.rpartition(":")[0]
    assert ipaddress.ip_address(host).is_loopback, "reachable from inside the container alone"
    admin = port_of(gateway.admin_listen)
    published = load_compose()["services"]["gateway"].get("ports", [])
    assert not [p for p in published if p.endswith(f":{admin}")]
    deployment = next(r for r in overlay if r["metadata"]["name"] == "gateway")
    assert admin not in {p["containerPort"] for p in container(deployment)["ports"]}


def test_4_admin_tokens_are_long_and_read_from_files(tmp_path: Path) -> None:
    settings = container_settings()
    assert settings.gateway.admin_token_file is not None
    assert settings.inference.admin_token is None, "model control stays off in deploys"
    config, _ = loopback_config(tmp_path)
    token = load_settings(config, "gateway").gateway.admin_token
    assert token is not None and len(token.get_secret_value()) >= MIN_ADMIN_TOKEN


def tracked_files() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


SECRET_NAME = re.compile(r"(?i)(^|_)(token|password|passwd|secret|api_?key)$")
SECRET_ENV = re.compile(r"TOKEN|PASSWORD|SECRET|API_?KEY")


def inline_secrets(node: Any, where: str) -> list[str]:
    """Places in a YAML document where a secret is given as a value: a key named like one
    (admin_token, password...) holding text, a Kubernetes env entry or a compose variable
    named like one holding a literal, or any kustomize secret literal."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            here = f"{where}.{key}"
            literal = isinstance(value, str) and value and not value.startswith("${")
            if literal and SECRET_NAME.search(str(key)):
                found.append(here)
            if key == "literals" and value:
                found.append(here)
            if key == "environment" and isinstance(value, dict):
                found += [f"{here}.{k}" for k, v in value.items() if SECRET_ENV.search(k) and v]
            found += inline_secrets(value, here)
    elif isinstance(node, list):
        for index, item in enumerate(node):
            if isinstance(item, dict) and SECRET_ENV.search(str(item.get("name", ""))):
                found += [f"{where}[{index}]"] if "value" in item else []
            found += inline_secrets(item, f"{where}[{index}]")
    return found


def test_5_no_secret_is_committed(overlay: list[Resource]) -> None:
    assert not [r for r in overlay if r["kind"] == "Secret"], "Secrets are made in the cluster"
    found = []
    for path in tracked_files():
        if path.suffix in {".yaml", ".yml"}:
            for document in yaml.safe_load_all(path.read_text()):
                found += inline_secrets(document, str(path.relative_to(ROOT)))
    assert not found, found


def test_6_containers_are_hardened_under_compose() -> None:
    for name, service in load_compose()["services"].items():
        assert service.get("cap_drop") == ["ALL"], name
        assert service.get("read_only") is True, name
        assert "no-new-privileges:true" in service.get("security_opt", []), name


def test_7_pods_are_hardened_under_kubernetes(overlay: list[Resource]) -> None:
    for name, pod in pods(overlay):
        assert pod.get("automountServiceAccountToken") is False, name
        assert pod["securityContext"]["runAsNonRoot"], name
    for resource in overlay:
        for spec in pod_containers(resource):
            security = spec["securityContext"]
            assert security["allowPrivilegeEscalation"] is False, spec["name"]
            assert security["readOnlyRootFilesystem"] is True, spec["name"]
            assert security["capabilities"]["drop"] == ["ALL"], spec["name"]


def test_8_network_policies_close_ingress_and_egress(overlay: list[Resource]) -> None:
    policies = [r["spec"] for r in overlay if r["kind"] == "NetworkPolicy"]
    for kind in ("Ingress", "Egress"):
        assert {"podSelector": {}, "policyTypes": [kind]} in policies, f"no default-deny {kind}"
    for rule in (rule for p in policies for rule in p.get("egress", [])):
        assert rule.get("to") and rule.get("ports"), f"egress open to anywhere: {rule}"


def test_9_forwarded_addresses_are_not_believed() -> None:
    assert container_settings().gateway.rest.forwarded_allow_ips == []


def test_10_private_keys_and_secrets_are_written_0600(tmp_path: Path) -> None:
    make_certs(tmp_path)
    private = [tmp_path / identity / KEY for identity in IDENTITIES]
    for folder in (ADMIN_SECRET, KEYS_SECRET, "client"):
        private += list((tmp_path / folder).iterdir())
    for path in private:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_11_reflection_is_off() -> None:
    assert container_settings().server.reflection is False


def test_12_no_client_address_can_take_the_door() -> None:
    server = container_settings().server
    assert not server.accept_compressed, "a compressed message inflates before its size check"
    assert server.max_calls_per_client is not None
    assert server.max_calls_per_client < server.max_concurrent_rpcs


def test_the_checklist_page_names_every_item() -> None:
    text = CHECKLIST.read_text()
    items = sorted(
        (name for name in globals() if re.fullmatch(r"test_\d+_\w+", name)),
        key=lambda n: int(n.split("_")[1]),
    )
    for name in items:
        assert f"`{name}`" in text, f"docs/security.md's checklist lacks {name}"


def test_every_deploy_runs_the_checked_config(overlay: list[Resource]) -> None:
    commands = [service["command"] for service in strata_services(load_compose()).values()]
    commands += [container(d)["args"] for d in strata_workloads(overlay).values()]
    configs = {command[command.index("--config") + 1] for command in commands}
    assert configs == {f"configs/{COMPOSE_CONFIG.name}"}, "check every config a deploy runs"
