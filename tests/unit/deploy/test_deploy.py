"""Static checks of deploy/: the image, the compose file, and their agreement with the config.

No container engine runs here, so these read the files: the compose file against the Compose
Specification's JSON schema (as the docker-compose package ships it; `make test` fetches it),
and every service, port and environment variable it names against configs/compose.yaml and the
Settings model, both ways.
The helpers here are shared with the Kubernetes and entry-command tests.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import jsonschema
import pytest
import yaml
from pydantic import BaseModel, SecretStr

from scripts.make_certs import ADMIN_SECRET, IDENTITIES, KEYS_SECRET
from strata.config import Settings, load_settings
from strata.config.tls import GATEWAY, public_identity

ROOT = Path(__file__).resolve().parents[3]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_SCHEMA = ROOT / "build" / "schema" / "compose_spec.json"  # `make test` fetches it
COMPOSE_CONFIG = ROOT / "configs" / "compose.yaml"
DEFAULT_CONFIG = ROOT / "configs" / "default.yaml"
DOCKERFILE = DEPLOY / "Dockerfile"
COLLECTOR = "otel-collector"
FRONT = "front"  # HAProxy before the gateway (deploy/front), scraped when its profile runs
CONTAINER_CONFIGS = "/app/configs"  # where compose and Kubernetes mount configs/
GATEWAY_SECRETS = {ADMIN_SECRET, KEYS_SECRET}  # `make certs` folders the gateway alone mounts
# The gateway's door: where compose.yaml may differ from default.yaml besides services and tls.
# Shared memory is on for local clients in default.yaml, off in containers.
DOOR = ("api_keys_file", "admin_token_file", "rate_limits", "shared_memory")
# ... and the servers' (docs/security.md): no reflection, calls per client address capped.
SERVER_DOOR = ("reflection", "max_calls_per_client")
# ... and what containers cannot share: each has a /dev/shm of its own (docs/deploy.md).
SERVER_HOST = ("slab", "pipes")


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of the config as containers run it."""

    name: str  # compose service, Kubernetes Deployment and Service
    layer: str  # python -m services.<layer>
    listen: str
    metrics: str | None
    target: str | None
    rest: str | None = None  # the gateway's REST API

    @property
    def port(self) -> int:
        return port_of(self.listen)

    @property
    def ports(self) -> set[int]:
        """Every port the endpoint listens on: gRPC, metrics and (the gateway's) REST."""
        return {port_of(a) for a in (self.listen, self.metrics, self.rest) if a}

    @property
    def metrics_port(self) -> int | None:
        return port_of(self.metrics) if self.metrics else None


def port_of(address: str) -> int:
    return int(address.rpartition(":")[2])


def container_settings() -> Settings:
    return load_settings(COMPOSE_CONFIG)


def in_container(path: str | Path) -> str:
    """Where a path of the container config (relative to it) is, inside the image's /app."""
    return posixpath.normpath(posixpath.join(CONTAINER_CONFIGS, str(path)))


def container_certs() -> str:
    """Where the container config reads certificates from, inside the image's /app."""
    return in_container(yaml.safe_load(COMPOSE_CONFIG.read_text())["tls"]["certs"])


def identities_of(endpoint: Endpoint) -> set[str]:
    """The identities whose certificates a layer's container holds: its own, and the
    gateway's public one for the gateway."""
    if endpoint.layer == GATEWAY:
        return {GATEWAY, public_identity(GATEWAY)}
    return {endpoint.layer}


def endpoints(settings: Settings) -> dict[str, Endpoint]:
    """Every endpoint of the config, by the name its container and Service carry."""
    services = settings.services
    named = {
        "gateway": ("gateway", services.gateway),
        "preprocess": ("preprocess", services.preprocess),
        "postprocess": ("postprocess", services.postprocess),
    }
    for key, endpoint in services.inference.items():
        named[f"inference-{key}"] = ("inference", endpoint)
    return {
        name: Endpoint(name, layer, e.listen, e.metrics, e.target, getattr(e, "rest", None))
        for name, (layer, e) in named.items()
    }


@dataclass(frozen=True)
class Command:
    """A service's entry command: `python -m strata.LAYER --config FILE [--listen ADDR]`."""

    layer: str
    config: str
    listen: str | None


def parse_command(argv: list[str]) -> Command:
    assert argv[:2] == ["python", "-m"] and argv[2].startswith("services."), argv
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--config", required=True)
    parser.add_argument("--listen")
    args = parser.parse_args(argv[3:])
    return Command(argv[2].removeprefix("services."), args.config, args.listen)


def endpoint_of(settings: Settings, command: Command) -> Endpoint:
    """The endpoint a command serves, found the way strata.rpc.main finds it."""
    listen = command.listen
    if listen is None:
        layer = command.layer
        own = settings.services.primary_inference if layer == "inference" else None
        listen = (own or getattr(settings.services, layer)).listen
    matches = [e for e in endpoints(settings).values() if e.listen == listen]
    assert len(matches) == 1, f"{command} serves no single config endpoint"
    assert matches[0].layer == command.layer, f"{command} listens on another layer's address"
    return matches[0]


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def strata_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The compose services that run a Strata layer."""
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("command", [])[:2] == ["python", "-m"]
        and service["command"][2].startswith("services.")
    }


def interpolate(value: str) -> str:
    """A compose value with `${VAR:-default}` resolved to its default (no host variables)."""

    def default(match: re.Match[str]) -> str:
        if match.group(2) is None:
            raise AssertionError(f"{value!r}: give compose variables a default (${{VAR:-x}})")
        return match.group(2)

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", default, value)


def env_of(service: dict[str, Any]) -> dict[str, str]:
    environment = service.get("environment", {})
    assert isinstance(environment, dict), "write environment as a mapping"
    return {key: interpolate(str(value)) for key, value in environment.items()}


def seconds(duration: str) -> float:
    """A compose duration (`15s`, `1m30s`) in seconds."""
    parts = re.fullmatch(r"(?:(\d+)m)?(?:(\d+)s)?", duration)
    assert parts and duration, f"unreadable duration {duration!r}"
    return int(parts.group(1) or 0) * 60 + int(parts.group(2) or 0)


def settings_field(name: str) -> list[str]:
    """The field path a STRATA_ variable sets, checked against the Settings model."""
    assert name.startswith("STRATA_"), name
    parts = name.removeprefix("STRATA_").lower().split("__")
    annotation: Any = Settings
    for part in parts:
        annotation = _model_or_map(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            assert part in annotation.model_fields, f"{name}: {part!r} is no config field"
            annotation = annotation.model_fields[part].annotation
        elif get_origin(annotation) is dict:
            annotation = get_args(annotation)[1]
        else:
            raise AssertionError(f"{name}: {part!r} goes below a plain value")
    return parts


def _model_or_map(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return next((a for a in inner if a is not SecretStr), inner[0])
    return annotation


def read_field(settings: Settings, parts: list[str]) -> str:
    """The value at a field path, as the string an environment variable would give."""
    value: Any = settings
    for part in parts:
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    if value is None:
        return ""  # an empty variable leaves an optional setting unset
    return value.get_secret_value() if isinstance(value, SecretStr) else str(value)


def assert_env_reaches_settings(env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Each STRATA_ variable names a real field and, set, lands there in loaded settings."""
    for name, value in env.items():
        if name.startswith("STRATA_"):
            parts = settings_field(name)
            monkeypatch.setenv(name, value)
            assert read_field(container_settings(), parts) == value, name
            monkeypatch.delenv(name)


def test_compose_file_matches_the_compose_specification() -> None:
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    problems = validator.iter_errors(load_compose())
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in problems]
    assert not errors, "\n".join(errors)


def test_every_config_endpoint_runs_as_a_compose_service_and_back() -> None:
    settings = container_settings()
    served = {
        name: endpoint_of(settings, parse_command(service["command"]))
        for name, service in strata_services(load_compose()).items()
    }
    assert {name: e.name for name, e in served.items()} == {n: n for n in endpoints(settings)}


def test_callers_reach_each_layer_by_its_compose_name() -> None:
    settings = container_settings()
    for name, endpoint in endpoints(settings).items():
        assert endpoint.listen.startswith("0.0.0.0:"), f"{name} must listen on every interface"
        if name != "gateway":
            assert endpoint.target == f"dns:///{name}:{endpoint.port}", name
    compose = load_compose()
    assert set(compose["services"]) >= set(endpoints(settings))


def test_ports_health_checks_and_limits_match_the_config() -> None:
    settings = container_settings()
    compose = load_compose()
    for name, service in strata_services(compose).items():
        endpoint = endpoints(settings)[name]
        assert set(service["expose"]) == {str(port) for port in endpoint.ports}, name
        health = service["healthcheck"]["test"]
        assert health == [
            *(
                "CMD",
                "python",
                "-I",
                "-S",
                "strata/tools/probe.py",
                f"127.0.0.1:{endpoint.metrics_port}",
            )
        ], f"{name}: asks its own metrics port whether it is ready, importing nothing else"
        assert service["restart"] in {"always", "unless-stopped", "on-failure"}, name
        limits = service["deploy"]["resources"]["limits"]
        assert limits.get("cpus") and limits.get("memory"), name
        grace = seconds(service["stop_grace_period"])
        assert grace > settings.server.grace_seconds, f"{name}: stop_grace_period cuts the drain"
        published = service.get("ports", [])
        if name == "gateway":
            # Published on the host's loopback only: the admin API shares the gRPC port.
            public = [port_of(endpoint.listen), port_of(endpoint.rest)]
            assert sorted(published) == sorted(f"127.0.0.1:{p}:{p}" for p in public)
        else:
            # A published host port or a container name would stop `--scale` working.
            assert not published and "container_name" not in service, name
    for name, service in compose["services"].items():
        assert service.get("restart") and service["deploy"]["resources"]["limits"], name


def test_the_config_is_mounted_from_the_repository() -> None:
    for name, service in strata_services(load_compose()).items():
        command = parse_command(service["command"])
        assert f"../configs:{CONTAINER_CONFIGS}:ro" in service["volumes"], name
        assert command.config.startswith("configs/"), name
        assert (ROOT / command.config).is_file(), f"{name}: no {command.config} in the repo"
        assert (COMPOSE_FILE.parent / service["build"]["context"] / "deploy/Dockerfile").is_file()


def test_the_gateway_waits_for_healthy_upstreams() -> None:
    compose = load_compose()
    depends = compose["services"]["gateway"]["depends_on"]
    for name in set(strata_services(compose)) - {"gateway"}:
        assert depends[name] == {"condition": "service_healthy"}, name


def test_environment_variables_are_config_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = load_compose()
    for service in strata_services(compose).values():
        assert_env_reaches_settings(env_of(service), monkeypatch)
    for name, service in strata_services(compose).items():
        secret = [v for v in service["environment"] if re.search("TOKEN|KEY", v)]
        assert not secret, f"{name}: secrets come from mounted files, never the environment"


def test_traces_go_to_the_collector_and_on_to_jaeger() -> None:
    compose = load_compose()
    collector = yaml.safe_load((DEPLOY / "otel-collector.yaml").read_text())
    receiver_port = port_of(collector["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])
    for name, service in strata_services(compose).items():
        endpoint = env_of(service)["OTEL_EXPORTER_OTLP_ENDPOINT"]
        assert endpoint == f"http://{COLLECTOR}:{receiver_port}", name
    assert str(receiver_port) in compose["services"][COLLECTOR]["expose"]
    pipeline = collector["service"]["pipelines"]["traces"]
    for kind in ("receivers", "processors", "exporters"):
        assert set(pipeline[kind]) <= set(collector[kind]), kind
    exporter = collector["exporters"][pipeline["exporters"][0]]["endpoint"]
    host, _, port = exporter.rpartition(":")
    assert port in compose["services"][host]["expose"]


def test_prometheus_scrapes_every_metrics_port() -> None:
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    scraped = set()
    for job in prometheus["scrape_configs"]:
        for static in job.get("static_configs", []):
            scraped |= {(t.rpartition(":")[0], port_of(t)) for t in static["targets"]}
        for dns in job.get("dns_sd_configs", []):
            scraped |= {(name, dns["port"]) for name in dns["names"]}
    expected = {(e.name, e.metrics_port) for e in endpoints(container_settings()).values()}
    assert None not in {port for _, port in expected}, "every endpoint needs a metrics port"
    assert expected <= scraped
    assert {(host, port) for host, port in scraped if host not in {COLLECTOR, FRONT}} == expected


def test_layers_speak_mutual_tls_each_with_its_own_certificate() -> None:
    tls = container_settings().tls
    assert tls.enabled and not tls.probe_listen, "probe ports are per container (k8s env)"
    internal = {e.layer for e in endpoints(container_settings()).values()} - {GATEWAY}
    assert tls.allowed_clients == {layer: [GATEWAY] for layer in internal}
    certs = container_certs()
    for name, service in strata_services(load_compose()).items():
        mounts = [v.split(":") for v in service["volumes"]]
        held = {Path(source).name for source, *_ in mounts if source.startswith("../build/certs")}
        secrets = held & GATEWAY_SECRETS
        assert not secrets or name == GATEWAY, f"{name} holds the gateway's {secrets}"
        held -= GATEWAY_SECRETS
        assert held == identities_of(endpoints(container_settings())[name]), name
        assert held <= set(IDENTITIES), f"{name}: `make certs` makes no such identity"
        for identity in held:
            mount = [f"../build/certs/{identity}", f"{certs}/{identity}", "ro"]
            assert mount in mounts, f"{name}: mount {identity} read-only where the config reads"


def test_compose_config_is_the_default_outside_services_tls_and_the_door() -> None:
    # A laptop's `make run` speaks plaintext on loopback by default (TLS there is opt-in, as
    # tests/e2e/test_security.py runs it), with the door open; containers always speak mutual
    # TLS between layers, and their door is closed (keys, rate limits, the admin token's file).
    default = yaml.safe_load(DEFAULT_CONFIG.read_text())
    compose = yaml.safe_load(COMPOSE_CONFIG.read_text())
    for config in (default, compose):
        config.pop("services")
        config.pop("tls", None)
        for key in DOOR:
            config["gateway"].pop(key, None)
        for key in SERVER_DOOR + SERVER_HOST:
            config["server"].pop(key, None)
    assert compose == default, (
        "configs/compose.yaml must equal configs/default.yaml outside `services:`, `tls:`, "
        f"the gateway's {DOOR} and the servers' {SERVER_DOOR + SERVER_HOST}; copy the change over"
    )


def dockerfile_stages() -> list[list[str]]:
    """The Dockerfile's instructions (continuations joined), split into stages at FROM."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    stages: list[list[str]] = [[]]
    for line in lines:
        if line.startswith("FROM "):
            stages.append([])
        if not line.startswith("#"):
            stages[-1].append(line)
    return stages


def test_the_image_is_pinned_multi_stage_and_runs_as_a_user() -> None:
    preamble, *stages = dockerfile_stages()
    base = next(line for line in preamble if line.startswith("ARG PYTHON_IMAGE="))
    assert re.fullmatch(r"ARG PYTHON_IMAGE=python:\d+\.\d+\.\d+-slim(-\w+)?", base), base
    assert all(stage[0].startswith("FROM ${PYTHON_IMAGE}") for stage in stages)
    assert len(stages) >= 2, "build tools must stay in a build stage"
    build, final = stages[0], stages[-1]
    assert "ARG BAKE_MODELS=0" in build
    assert any("models.build --out build" in line and "BAKE_MODELS" in line for line in build)
    installs = [line for stage in stages for line in stage if "pip install" in line]
    for line in installs:
        for command in re.findall(r"pip install[^&;]*", line):
            assert "-c constraints.txt" in command, command
    final_text = "\n".join(final)
    for tool in ("/tools", "grpcio-tools", "pip install", "apt-get", "models", "scripts"):
        assert tool not in final_text, tool
    user = next(line for line in final if line.startswith("USER "))
    uid = user.split()[1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, "run as a numeric non-root user"


def test_the_image_exposes_every_configured_port() -> None:
    final = dockerfile_stages()[-1]
    exposed = {int(p) for line in final if line.startswith("EXPOSE ") for p in line.split()[1:]}
    configured = set()
    for endpoint in endpoints(container_settings()).values():
        configured |= endpoint.ports
    assert exposed == configured


def test_field_paths_are_checked() -> None:
    assert settings_field("STRATA_SERVICES__INFERENCE__B__LISTEN") == [
        "services",
        "inference",
        "b",
        "listen",
    ]
    with pytest.raises(AssertionError, match="no config field"):
        settings_field("STRATA_GATEWAY__ADMIN_TOKN")
    with pytest.raises(AssertionError, match="below a plain value"):
        settings_field("STRATA_SERVER__GRACE_SECONDS__X")
