"""Static checks of deploy/k8s: each overlay, built kustomize-style, is valid and agrees with
the config.

Every rendered manifest is validated with kubernetes-validate (strict: unknown fields fail)
against the oldest and newest Kubernetes versions we target; then every endpoint of
configs/compose.yaml must have its Deployment, Service, probes and ports, and every Strata
workload must map back to an endpoint. Rollouts must not drop requests: each pod leaves the
endpoints (preStop) before SIGTERM starts the drain, and the grace period covers both.
"""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from tests.unit.test_deploy import (
    COLLECTOR,
    COMPOSE_CONFIG,
    DEPLOY,
    Endpoint,
    assert_env_reaches_settings,
    container_settings,
    dockerfile_stages,
    endpoint_of,
    endpoints,
    load_compose,
    parse_command,
    port_of,
)
from tests.unit.test_deploy_kustomize import Resource, build, find, pod_containers

K8S = DEPLOY / "k8s"
OVERLAYS = {"dev": "strata-dev", "prod": "strata"}
KUBERNETES_VERSIONS = ("1.29", "1.37")
ADMIN_SECRET = ("strata-admin", "token")
CONFIG_MAP = "strata-config"


@pytest.fixture(scope="module", params=sorted(OVERLAYS))
def overlay(request: pytest.FixtureRequest) -> tuple[str, list[Resource]]:
    return request.param, build(K8S / "overlays" / request.param)


def strata_workloads(resources: list[Resource]) -> dict[str, Resource]:
    """Deployments that run the Strata image, by name."""
    return {
        r["metadata"]["name"]: r
        for r in resources
        if r["kind"] == "Deployment" and "strata" in pod_containers(r)[0].get("image", "")
    }


def container(deployment: Resource) -> dict[str, Any]:
    """The one container of a Strata pod."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{deployment['metadata']['name']}: one container per pod"
    return containers[0]


def selects(selector: dict[str, str], deployment: Resource) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def serving(deployment: Resource) -> Endpoint:
    """The config endpoint a Deployment's command serves."""
    return endpoint_of(container_settings(), parse_command(container(deployment)["args"]))


def test_manifests_are_valid_kubernetes(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    failures = []
    for resource in resources:
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(resource, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                name = f"{resource['kind']}/{resource['metadata']['name']}"
                failures.append(f"{name} ({version}): {str(exc).splitlines()[0]}")
    assert not failures, "\n".join(failures)


def test_every_endpoint_has_a_deployment_and_service_and_back(
    overlay: tuple[str, list[Resource]],
) -> None:
    _, resources = overlay
    config = endpoints(container_settings())
    deployments = strata_workloads(resources)
    assert set(deployments) == set(config)
    for name, deployment in deployments.items():
        endpoint = config[name]
        assert serving(deployment) == endpoint, f"{name} runs another endpoint"
        ports = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
        assert ports == {"grpc": endpoint.port, "metrics": endpoint.metrics_port}, name
        service = find(resources, "Service", name)
        assert selects(service["spec"]["selector"], deployment), name
        others = [d for n, d in deployments.items() if n != name]
        assert not any(selects(service["spec"]["selector"], d) for d in others), name
        service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        assert service_ports["grpc"] == (endpoint.port, "grpc"), name
        if name != "gateway":
            assert service["spec"]["clusterIP"] == "None", f"{name}: clients balance; headless"
            assert endpoint.target == f"dns:///{name}:{endpoint.port}", name
    services = {r["metadata"]["name"] for r in resources if r["kind"] == "Service"}
    assert services - {COLLECTOR} == set(config)


def test_probes_use_grpc_health_on_the_listen_port(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    config = endpoints(container_settings())
    for name, deployment in strata_workloads(resources).items():
        spec = container(deployment)
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert spec[probe]["grpc"] == {"port": config[name].port}, f"{name} {probe}"
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/port"] == str(config[name].metrics_port), name


def test_rollouts_drain_before_the_pod_goes(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    grace = container_settings().server.grace_seconds
    for name, deployment in strata_workloads(resources).items():
        spec = deployment["spec"]
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, name
        pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
        assert pre_stop[0] == "sleep" and int(pre_stop[1]) > 0, name
        # The grace period counts from preStop: it must cover the sleep, the drain and the flush.
        period = spec["template"]["spec"]["terminationGracePeriodSeconds"]
        assert period >= int(pre_stop[1]) + grace + 5, f"{name}: grace period cuts the drain"
        liveness = container(deployment)["livenessProbe"]
        assert liveness["periodSeconds"] * liveness["failureThreshold"] > grace, (
            f"{name}: liveness would kill a draining pod (NOT_SERVING)"
        )


def test_each_deployment_has_a_disruption_budget(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    budgets = [r for r in resources if r["kind"] == "PodDisruptionBudget"]
    for name, deployment in strata_workloads(resources).items():
        mine = [b for b in budgets if selects(b["spec"]["selector"]["matchLabels"], deployment)]
        assert len(mine) == 1, f"{name} needs exactly one PodDisruptionBudget"


def test_preprocess_is_autoscaled(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    hpa = find(resources, "HorizontalPodAutoscaler", "preprocess")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "preprocess",
    }
    assert 1 <= hpa["spec"]["minReplicas"] < hpa["spec"]["maxReplicas"]
    preprocess = find(resources, "Deployment", "preprocess")
    assert "replicas" not in preprocess["spec"], "the HPA owns the replica count"


def test_every_container_has_requests_and_limits(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for resource in resources:
        for spec in pod_containers(resource):
            for kind in ("requests", "limits"):
                assert set(spec["resources"][kind]) == {"cpu", "memory"}, resource["metadata"]


def test_pods_run_as_the_image_user(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    user = next(line for line in dockerfile_stages()[-1] if line.startswith("USER "))
    uid = int(user.split()[1].split(":")[0])
    for name, deployment in strata_workloads(resources).items():
        security = deployment["spec"]["template"]["spec"]["securityContext"]
        assert security["runAsNonRoot"] and security["runAsUser"] == uid, name
        assert container(deployment)["securityContext"]["readOnlyRootFilesystem"], name


def test_commands_are_the_compose_commands(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    compose = load_compose()["services"]
    for name, deployment in strata_workloads(resources).items():
        assert container(deployment)["args"] == compose[name]["command"], name


def test_the_config_map_is_the_container_config(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    config_map = find(resources, "ConfigMap", CONFIG_MAP)
    assert config_map["data"] == {COMPOSE_CONFIG.name: COMPOSE_CONFIG.read_text()}, (
        "deploy/k8s/base/compose.yaml must be a copy of configs/compose.yaml"
    )
    for name, deployment in strata_workloads(resources).items():
        spec = deployment["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container(deployment)["volumeMounts"]}
        assert volumes[mounts["/app/configs"]]["configMap"]["name"] == CONFIG_MAP, name
        config = parse_command(container(deployment)["args"]).config
        assert config == f"configs/{COMPOSE_CONFIG.name}", name


def test_environment_variables_are_config_fields(
    overlay: tuple[str, list[Resource]], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, resources = overlay
    collector = find(resources, "Service", COLLECTOR)
    otlp_port = next(p["port"] for p in collector["spec"]["ports"] if p["name"] == "otlp-grpc")
    for name, deployment in strata_workloads(resources).items():
        env = {e["name"]: e for e in container(deployment)["env"]}
        literal = {k: e["value"] for k, e in env.items() if "value" in e}
        secret = {k: "placeholder" for k, e in env.items() if "valueFrom" in e}
        assert_env_reaches_settings({**literal, **secret}, monkeypatch)
        otlp = literal["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert otlp == f"http://{COLLECTOR}:{otlp_port}", name
        assert port_of(otlp) == otlp_port


def test_the_admin_token_comes_from_a_secret(overlay: tuple[str, list[Resource]]) -> None:
    name, resources = overlay
    gateway = container(find(resources, "Deployment", "gateway"))
    token = next(e for e in gateway["env"] if e["name"] == "STRATA_GATEWAY__ADMIN_TOKEN")
    reference = token["valueFrom"]["secretKeyRef"]
    assert (reference["name"], reference["key"]) == ADMIN_SECRET
    secrets = [r for r in resources if r["kind"] == "Secret"]
    if name == "prod":
        assert not secrets, "prod's admin token is created in the cluster, never committed"
    else:
        (secret,) = secrets
        value = base64.b64decode(secret["data"][ADMIN_SECRET[1]]).decode()
        assert "placeholder" in value


def test_resources_live_in_the_overlay_namespace(overlay: tuple[str, list[Resource]]) -> None:
    name, resources = overlay
    namespace = OVERLAYS[name]
    assert find(resources, "Namespace", namespace)
    for resource in resources:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == namespace, resource["metadata"]


def test_base_config_copy_is_checked_in() -> None:
    copy = K8S / "base" / COMPOSE_CONFIG.name
    assert copy.read_text() == COMPOSE_CONFIG.read_text(), f"cp {COMPOSE_CONFIG} {copy}"


def test_images_are_tagged(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for resource in resources:
        for spec in pod_containers(resource):
            tag = spec["image"].rpartition(":")[2]
            assert tag and tag != "latest" and "/" not in tag, spec["image"]
