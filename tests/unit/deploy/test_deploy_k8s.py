"""Static checks of deploy/k8s: each overlay, built kustomize-style, is valid and agrees with
the config.

Every rendered manifest is validated with kubernetes-validate (strict: unknown fields fail)
against the oldest and newest Kubernetes versions we target; then every endpoint of
configs/compose.yaml must have its Deployment, Service, probes and ports, and every Strata
workload must map back to an endpoint. Rollouts must not drop requests: each pod leaves the
endpoints (preStop) before SIGTERM starts the drain, and the grace period covers both. Control
is closed: the layers speak mutual TLS with a certificate per identity, NetworkPolicies admit
only the gateway to them, and probes use the plaintext probe port, as kubelet cannot present
a certificate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from scripts.make_certs import (
    ADMIN_FILE,
    ADMIN_SECRET,
    KEYS_FILE,
    KEYS_SECRET,
    make_certs,
    secret_name,
)
from strata.config.tls import CA, CERT, GATEWAY, KEY
from tests.unit.deploy.test_deploy import (
    COLLECTOR,
    COMPOSE_CONFIG,
    DEPLOY,
    Endpoint,
    assert_env_reaches_settings,
    container_certs,
    container_settings,
    dockerfile_stages,
    endpoint_of,
    endpoints,
    identities_of,
    in_container,
    load_compose,
    parse_command,
    port_of,
)
from tests.unit.deploy.test_deploy_kustomize import Resource, build, find, pod_containers

K8S = DEPLOY / "k8s"
OVERLAYS = {"dev": "strata-dev", "prod": "strata"}
KUBERNETES_VERSIONS = ("1.29", "1.37")
CONFIG_MAP = "strata-config"
PROBE_ENV = "STRATA_TLS__PROBE_LISTEN"
FRONT_SECRET = "strata-tls-gateway-public"  # the front beside the gateway serves its certificate


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
    """The Strata container of a Strata pod: its one container, but for the gateway's front
    (deploy/front) beside it."""
    containers = deployment["spec"]["template"]["spec"]["containers"]
    name = deployment["metadata"]["name"]
    others = [c["name"] for c in containers[1:]]
    assert others == (["front"] if name == GATEWAY else []), f"{name}: one container per pod"
    return containers[0]


def selects(selector: dict[str, str], deployment: Resource) -> bool:
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    return all(labels.get(k) == v for k, v in selector.items())


def serving(deployment: Resource) -> Endpoint:
    """The config endpoint a Deployment's command serves."""
    return endpoint_of(container_settings(), parse_command(container(deployment)["args"]))


@pytest.mark.slow
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
        expected = {"grpc": endpoint.port, "metrics": endpoint.metrics_port}
        if endpoint.rest:
            expected["rest"] = port_of(endpoint.rest)
        assert ports == {**expected, "probe": probe_port(deployment)}, name
        service = find(resources, "Service", name)
        assert selects(service["spec"]["selector"], deployment), name
        others = [d for n, d in deployments.items() if n != name]
        assert not any(selects(service["spec"]["selector"], d) for d in others), name
        service_ports = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
        assert service_ports["grpc"] == (endpoint.port, "grpc"), name
        grpc_port = next(p for p in service["spec"]["ports"] if p["name"] == "grpc")
        assert grpc_port["appProtocol"] == "https", f"{name}: its gRPC port speaks TLS"
        if name != "gateway":
            assert service["spec"]["clusterIP"] == "None", f"{name}: clients balance; headless"
            assert endpoint.target == f"dns:///{name}:{endpoint.port}", name
    services = {r["metadata"]["name"] for r in resources if r["kind"] == "Service"}
    assert services - {COLLECTOR} == set(config)


def probe_port(deployment: Resource) -> int:
    """The plaintext probe port the container's environment opens."""
    env = {e["name"]: e.get("value") for e in container(deployment)["env"]}
    return port_of(env[PROBE_ENV])


def test_probes_ask_the_plaintext_probe_port(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    config = endpoints(container_settings())
    assert container_settings().tls.enabled, "the listen ports need a client certificate"
    for name, deployment in strata_workloads(resources).items():
        spec = container(deployment)
        probe = probe_port(deployment)
        assert probe not in {config[name].port, config[name].metrics_port}, name
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert spec[kind]["grpc"] == {"port": probe}, f"{name} {kind}"
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
        "the ConfigMap must be configs/compose.yaml (configs/kustomization.yaml generates it)"
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


def test_the_gateways_secrets_are_mounted_files_never_committed(
    overlay: tuple[str, list[Resource]],
) -> None:
    _, resources = overlay
    assert not [r for r in resources if r["kind"] == "Secret"], "created in the cluster"
    gateway = find(resources, "Deployment", "gateway")
    volumes = {v["name"]: v for v in gateway["spec"]["template"]["spec"]["volumes"]}
    mounted = {
        volumes[m["name"]]["secret"]["secretName"]: m
        for m in container(gateway)["volumeMounts"]
        if "secret" in volumes[m["name"]]
    }
    gateway_settings = container_settings().gateway
    for secret, file, path in [
        (ADMIN_SECRET, ADMIN_FILE, gateway_settings.admin_token_file),
        (KEYS_SECRET, KEYS_FILE, gateway_settings.api_keys_file),
    ]:
        mount = mounted[secret]
        assert "subPath" not in mount, f"{secret}: a subPath mount never sees a rotation"
        assert mount["readOnly"] and in_container(path) == f"{mount['mountPath']}/{file}"
    assert not any("valueFrom" in e for e in container(gateway)["env"]), "no secret in env"


def test_resources_live_in_the_overlay_namespace(overlay: tuple[str, list[Resource]]) -> None:
    name, resources = overlay
    namespace = OVERLAYS[name]
    assert find(resources, "Namespace", namespace)
    for resource in resources:
        if resource["kind"] != "Namespace":
            assert resource["metadata"]["namespace"] == namespace, resource["metadata"]


def test_the_config_is_not_copied_under_deploy() -> None:
    # The ConfigMap is generated beside the file (configs/kustomization.yaml); a copy would drift.
    config = COMPOSE_CONFIG.read_text()
    copies = [p for p in DEPLOY.rglob("*.yaml") if p.read_text() == config]
    assert not copies, f"{copies}: list ../../../configs as a resource instead (docs/deploy.md)"


def test_images_are_tagged(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    for resource in resources:
        for spec in pod_containers(resource):
            tag = spec["image"].rpartition(":")[2]
            assert tag and tag != "latest" and "/" not in tag, spec["image"]


def test_each_pod_holds_only_its_own_identity(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    config = endpoints(container_settings())
    for name, deployment in strata_workloads(resources).items():
        pod = deployment["spec"]["template"]["spec"]
        secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
        mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
        held = set()
        for volume, secret in secrets.items():
            if volume not in mounts:  # the front's: the gateway's public identity, its own
                assert (name, secret) == (GATEWAY, FRONT_SECRET), f"{name} holds {secret}"
                continue
            if secret in (ADMIN_SECRET, KEYS_SECRET):
                assert name == GATEWAY, f"{name} mounts the gateway's {secret}"
                continue
            identity = secret.removeprefix(secret_name(""))
            assert secret == secret_name(identity), f"{name}: {secret} is no identity's Secret"
            assert mounts[volume]["mountPath"] == f"{container_certs()}/{identity}", name
            assert mounts[volume]["readOnly"], name
            held.add(identity)
        assert held == identities_of(config[name]), name
        security = pod["securityContext"]
        assert security["fsGroup"] == security["runAsGroup"], f"{name} cannot read its key"


def pod_labels(deployment: Resource) -> dict[str, str]:
    return deployment["spec"]["template"]["metadata"]["labels"]


def label_selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (matchLabels, matchExpressions with In) against a pod's labels."""
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In", f"unsupported here: {expression}"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return True


def admitted(resources: list[Resource], deployment: Resource) -> list[tuple[int, list]]:
    """(port, sources) for each port an ingress rule opens on the deployment's pods; sources
    is the rule's `from` (empty: from anywhere)."""
    named = {p["name"]: p["containerPort"] for p in container(deployment)["ports"]}
    out = []
    for policy in (r for r in resources if r["kind"] == "NetworkPolicy"):
        if label_selects(policy["spec"]["podSelector"], pod_labels(deployment)):
            for rule in policy["spec"].get("ingress", []):
                assert rule.get("ports"), f"{policy['metadata']['name']}: a rule opens every port"
                for port in rule["ports"]:
                    out.append((named.get(port["port"], port["port"]), rule.get("from", [])))
    return out


def test_ingress_is_closed_by_default(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    policies = [r["spec"] for r in resources if r["kind"] == "NetworkPolicy"]
    assert {"podSelector": {}, "policyTypes": ["Ingress"]} in policies
    assert all("Ingress" in p["policyTypes"] for p in policies if "ingress" in p)


def test_only_the_gateway_reaches_the_layers(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    workloads = strata_workloads(resources)
    config = endpoints(container_settings())
    for name, deployment in workloads.items():
        rules = admitted(resources, deployment)
        callers = [sources for port, sources in rules if port == config[name].port]
        assert callers, f"{name}: nothing may call it"
        if name == GATEWAY:
            assert [] in callers, "clients reach the gateway from anywhere"
            continue
        for sources in callers:
            (source,) = sources
            assert set(source) == {"podSelector"}, f"{name}: admits more than pods here"
            chosen = [
                n
                for n, d in workloads.items()
                if label_selects(source["podSelector"], pod_labels(d))
            ]
            assert chosen == [GATEWAY], f"{name} admits {chosen}"
        opened = {port for port, _ in rules}
        assert opened == {config[name].port, config[name].metrics_port}, name
        assert probe_port(deployment) not in opened, "probes come from the node alone"


def test_metrics_are_open_to_prometheus_alone(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    config = endpoints(container_settings())
    for name, deployment in strata_workloads(resources).items():
        port = config[name].metrics_port
        scrapers = [
            sources for opened, sources in admitted(resources, deployment) if opened == port
        ]
        assert scrapers, f"{name}: Prometheus cannot scrape it"
        for sources in scrapers:
            assert sources and all(set(s) == {"namespaceSelector"} for s in sources), name


def test_the_collector_takes_otlp_from_strata_pods(overlay: tuple[str, list[Resource]]) -> None:
    _, resources = overlay
    service = find(resources, "Service", COLLECTOR)
    otlp_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "otlp-grpc")
    rules = admitted(resources, find(resources, "Deployment", COLLECTOR))
    strata = {"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "strata"}}}
    assert rules == [(otlp_port, [strata])]
    for deployment in strata_workloads(resources).values():
        assert label_selects(strata["podSelector"], pod_labels(deployment))


def test_make_certs_generates_the_secrets_the_pods_mount(
    overlay: tuple[str, list[Resource]], tmp_path: Path
) -> None:
    _, resources = overlay
    make_certs(tmp_path)
    spec = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    generated = {g["name"]: g for g in spec["secretGenerator"]}
    mounted = {
        v["secret"]["secretName"]
        for d in strata_workloads(resources).values()
        for v in d["spec"]["template"]["spec"]["volumes"]
        if "secret" in v
    }
    assert set(generated) == mounted
    for name, generator in generated.items():
        files = dict(entry.split("=") for entry in generator["files"])
        assert all((tmp_path / path).is_file() for path in files.values())
        if name in (ADMIN_SECRET, KEYS_SECRET):
            assert generator["type"] == "Opaque" and len(files) == 1, name
            continue
        assert generator["type"] == "kubernetes.io/tls"
        assert set(files) == {CERT, KEY, CA}
