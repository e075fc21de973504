"""The front's configuration (deploy/front/haproxy.cfg) and those who start it agree: every
variable it reads is set by the compose service and by the front beside each Kubernetes
gateway, and by bench/front.py besides the TLS pair (a front with a certificate) and the
metrics address (which a caller may ask for); and each deployment's front is sized from its
rate as bench/front.py sizes one from a measured capacity."""

from __future__ import annotations

import re

import pytest
import yaml

from bench.front import CONFIG, FrontSettings, environment
from strata.config.pipelines import Pipeline
from tests.unit.deploy.test_deploy import COMPOSE_FILE
from tests.unit.deploy.test_deploy_k8s import K8S, OVERLAYS
from tests.unit.deploy.test_deploy_kustomize import build, find

# HAProxy's threads: the config's default (one) unless a deployment or a bench sets them.
TUNING = {"STRATA_FRONT_THREADS"}
OPTIONAL = {"STRATA_FRONT_PEM", "STRATA_GATEWAY_CA", "STRATA_FRONT_METRICS", *TUNING}


def read() -> set[str]:
    return set(re.findall(r"\$\{(\w+)(?:-[^}]*)?\}", CONFIG.read_text()))


def test_the_compose_front_sets_every_variable_the_config_reads() -> None:
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    assert set(compose["services"]["front"]["environment"]) == read() - TUNING


def test_the_bench_sets_every_variable_the_plaintext_config_reads() -> None:
    variables = environment("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", FrontSettings())
    assert set(variables) == read() - OPTIONAL


def test_the_front_runs_one_thread_unless_told() -> None:
    assert "STRATA_FRONT_THREADS" not in FrontSettings().variables()
    assert FrontSettings(threads=2).variables()["STRATA_FRONT_THREADS"] == "2"
    assert 'nbthread "${STRATA_FRONT_THREADS-1}"' in CONFIG.read_text()


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_kubernetes_front_sets_every_variable_and_mounts_the_config(overlay: str) -> None:
    resources = build(K8S / "overlays" / overlay)
    pod = find(resources, "Deployment", "gateway")["spec"]["template"]["spec"]
    (front,) = [c for c in pod["containers"] if c["name"] == "front"]
    assert {e["name"] for e in front["env"]} == read() - TUNING
    config = find(resources, "ConfigMap", "strata-front")["data"]
    assert config["haproxy.cfg"] == CONFIG.read_text()
    (mount,) = [m for m in front["volumeMounts"] if m["mountPath"] in front["args"][-1]]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mount["name"]]["configMap"]["name"] == "strata-front"


def test_a_front_is_sized_from_capacity_by_littles_law() -> None:
    # 737 answers/s and 250 ms: a fifth of it in the gateway is 36.85 calls, rounded up so
    # that the gateway can reach its capacity; a twentieth of it in the queue is 12.5 ms.
    assert FrontSettings.sized(737, 0.25) == FrontSettings(places=37, queue_ms=12, rate=737)
    assert FrontSettings.sized(737, 0.25, in_gateway=0.4, queued=0.1).places == 74
    assert FrontSettings.sized(1, 0.001) == FrontSettings(places=1, queue_ms=1, rate=1)
    with pytest.raises(ValueError, match="positive"):
        FrontSettings.sized(0, 0.25)


def deployed_fronts() -> dict[str, dict[str, str]]:
    """Each deployment's front variables: compose's and each Kubernetes overlay's."""
    compose = yaml.safe_load(COMPOSE_FILE.read_text())
    fronts = {"compose": compose["services"]["front"]["environment"]}
    for overlay in sorted(OVERLAYS):
        pod = find(build(K8S / "overlays" / overlay), "Deployment", "gateway")
        (front,) = [
            c for c in pod["spec"]["template"]["spec"]["containers"] if c["name"] == "front"
        ]
        fronts[overlay] = {e["name"]: e["value"] for e in front["env"] if "value" in e}
    return fronts


@pytest.mark.parametrize("deployment", ["compose", *sorted(OVERLAYS)])
def test_each_deployed_front_is_sized_from_its_rate_and_the_default_objective(
    deployment: str,
) -> None:
    variables = deployed_fronts()[deployment]
    objective = Pipeline.model_fields["latency_objective_ms"].default / 1000
    sized = FrontSettings.sized(int(variables["STRATA_FRONT_RATE"]), objective)
    assert {key: variables[key] for key in sized.variables()} == sized.variables()


def test_the_default_front_is_sized_like_the_deployed_ones() -> None:
    objective = Pipeline.model_fields["latency_objective_ms"].default / 1000
    assert FrontSettings() == FrontSettings.sized(FrontSettings().rate, objective)
