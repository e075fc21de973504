"""The front's configuration (deploy/front/haproxy.cfg) and those who start it agree: every
variable it reads is set by the compose service and by the front beside each Kubernetes
gateway, and by bench/front.py besides the TLS pair (a front with a certificate) and the
metrics address (which a caller may ask for)."""

from __future__ import annotations

import re

import pytest
import yaml

from bench.front import CONFIG, FrontSettings, environment
from tests.unit.deploy.test_deploy import COMPOSE_FILE
from tests.unit.deploy.test_deploy_k8s import K8S, OVERLAYS
from tests.unit.deploy.test_deploy_kustomize import build, find

OPTIONAL = {"STRATA_FRONT_PEM", "STRATA_GATEWAY_CA", "STRATA_FRONT_METRICS"}


def read() -> set[str]:
    return set(re.findall(r"\$\{(\w+)\}", CONFIG.read_text()))


def test_the_compose_front_sets_every_variable_the_config_reads() -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    assert set(compose["services"]["front"]["environment"]) == read()


def test_the_bench_sets_every_variable_the_plaintext_config_reads() -> None:
    variables = environment("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", FrontSettings())
    assert set(variables) == read() - OPTIONAL


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_kubernetes_front_sets_every_variable_and_mounts_the_config(overlay: str) -> None:
    resources = build(K8S / "overlays" / overlay)
    pod = find(resources, "Deployment", "gateway")["spec"]["template"]["spec"]
    (front,) = [c for c in pod["containers"] if c["name"] == "front"]
    assert {e["name"] for e in front["env"]} == read()
    config = find(resources, "ConfigMap", "strata-front")["data"]
    assert config["haproxy.cfg"] == CONFIG.read_text()
    (mount,) = [m for m in front["volumeMounts"] if m["mountPath"] in front["args"][-1]]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == "strata-front"
