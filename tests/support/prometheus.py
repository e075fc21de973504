"""A real Prometheus (Debian's `prometheus` package) scraping a running system with Strata's
rules, and the queries Strata's dashboard and rules make of it: for the check that every one
of them finds series (tests/e2e/test_prometheus.py) and for the dashboard's picture
(scripts/dashboard_picture.py).

The Prometheus config is deploy/prometheus.yml's jobs, each pointed at the running system's
metrics addresses, so the job names the rules select on are the shipped ones."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import yaml

from strata.config import Settings
from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from strata.wire import codec
from tests.support.system import ROOT, free_port

PROMETHEUS = shutil.which("prometheus")
DEPLOY = ROOT / "deploy"
SHIPPED_CONFIG = DEPLOY / "prometheus.yml"
RULES = DEPLOY / "rules" / "strata.rules.yml"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "strata.json"


def watched() -> dict[str, Any]:
    """Changes to the default config for a system Prometheus watches: every service's metrics
    page on a free loopback port, and a per-client rate limit tight enough that one client's
    quick burst is refused, loose enough for the load's clients (one request each) and their
    one peer's bucket (rate limits' peer_clients of them)."""

    def address(count: int = 1) -> str:
        return f"127.0.0.1:{free_port(count)}"

    return {
        "gateway": {"rate_limits": {"per_client": {"rate": 1, "burst": 3}}},
        "services": {
            "gateway": {"metrics": address()},
            "preprocess": {"metrics": address(2)},  # the default config's two replicas
            "postprocess": {"metrics": address()},
            "inference": {"a": {"metrics": address()}, "b": {"metrics": address()}},
        },
    }


def scrape_targets(settings: Settings) -> dict[str, list[dict[str, Any]]]:
    """Each shipped job's static configs for the system of `settings`."""
    services = settings.services
    preprocess = services.preprocess
    return {
        "gateway": [{"targets": [services.gateway.metrics]}],
        "preprocess": [{"targets": [preprocess.metrics_for(at) for at in preprocess.listens]}],
        "inference": [
            {"targets": [endpoint.metrics], "labels": {"deployment": name}}
            for name, endpoint in services.inference.items()
        ],
        "postprocess": [{"targets": [services.postprocess.metrics]}],
    }


def config(settings: Settings, interval: float) -> dict[str, Any]:
    """deploy/prometheus.yml's Strata jobs scraping the system of `settings` every `interval`
    seconds, with the shipped rules evaluated as often."""
    targets = scrape_targets(settings)
    shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
    jobs = [job["job_name"] for job in shipped["scrape_configs"] if job["job_name"] in targets]
    assert sorted(jobs) == sorted(targets), "deploy/prometheus.yml lost a layer's job"
    every = f"{round(interval * 1000)}ms"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every},
        "rule_files": [str(RULES)],
        "scrape_configs": [{"job_name": job, "static_configs": targets[job]} for job in jobs],
    }


@dataclass(frozen=True)
class Prometheus:
    """Prometheus' HTTP API at `url`."""

    url: str

    def get(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as answer:
            body = json.load(answer)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series `expr` gives now."""
        return self.get("/api/v1/query", query=expr)["result"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        return self.get("/api/v1/query_range", query=expr, start=start, end=end, step=step)[
            "result"
        ]

    def known_metrics(self) -> set[str]:
        """Every metric name Prometheus has series of, or a scraped page declared (a labelled
        counter nothing has counted yet declares its name but has no series). Metadata
        names families as OpenMetrics does: a counter without its `_total`."""
        names = set(self.get("/api/v1/label/__name__/values"))
        for family in self.get("/api/v1/metadata"):
            names |= {family + suffix for suffix in ("", "_total", "_bucket", "_count", "_sum")}
        return names

    def wait_for(self, expr: str, within: float = 20.0) -> None:
        """Wait until `expr` gives series (a scrape, or a rule's evaluation, has happened)."""
        deadline = time.monotonic() + within
        while not self.query(expr):
            assert time.monotonic() < deadline, f"no series for {expr} within {within} s"
            time.sleep(0.2)


@contextmanager
def running_prometheus(
    folder: Path, settings: Settings, interval: float = 1.0
) -> Iterator[Prometheus]:
    """Prometheus on a free loopback port scraping the system of `settings`, its storage in
    `folder`; stopped when the block ends."""
    assert PROMETHEUS, "prometheus is not installed"
    path = folder / "prometheus.yml"
    path.write_text(yaml.safe_dump(config(settings, interval)))
    address = f"127.0.0.1:{free_port()}"
    with (folder / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={path}",
                f"--storage.tsdb.path={folder / 'tsdb'}",
                f"--web.listen-address={address}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_ready(f"http://{address}", process, folder / "prometheus.log")
        yield Prometheus(f"http://{address}")
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_ready(url: str, process: subprocess.Popen, log: Path, within: float = 30.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        assert process.poll() is None, f"prometheus exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"prometheus not ready at {url} within {within} s")


def send_load(stub: v2_grpc.GRPCInferenceServiceStub, requests: int, first: int = 0) -> None:
    """`requests` requests to digits and tabular in turn, each from a client of its own. An
    error answer is part of what Prometheus should see, not the load's failure: on a busy
    machine a hop may time out."""
    for i in range(first, first + requests):
        client = (("x-client-id", f"load-{i}"),)
        if i % 2:
            request = codec.build_request(
                "tabular", {"features": np.full((1, 30), i % 7, np.float32)}
            )
        else:
            images = np.full((1 + i % 3, 16, 16), i % 256, np.uint8)
            request = codec.build_request("digits", {"images": images})
        try:
            stub.ModelInfer(request, metadata=client)
        except grpc.RpcError as error:
            assert error.code() != grpc.StatusCode.INVALID_ARGUMENT, error


def send_bad(stub: v2_grpc.GRPCInferenceServiceStub) -> None:
    """One request with the wrong shape, answered INVALID_ARGUMENT."""
    try:
        stub.ModelInfer(codec.build_request("digits", {"images": np.zeros((1, 8), np.uint8)}))
    except grpc.RpcError as error:
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error
    else:
        raise AssertionError("a bad request was answered")


def send_refused(stub: v2_grpc.GRPCInferenceServiceStub, attempts: int = 20) -> None:
    """Requests from one client until its rate limit (see `watched`) refuses one."""
    request = codec.build_request("tabular", {"features": np.zeros((1, 30), np.float32)})
    for _ in range(attempts):
        try:
            stub.ModelInfer(request, metadata=(("x-client-id", "greedy"),))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, error
            return
    raise AssertionError(f"{attempts} quick requests of one client were never refused")


def dashboard_queries(rate_interval: str) -> list[tuple[str, str]]:
    """(panel title or variable name, PromQL) of every query of the Strata dashboard, with
    Grafana's variables filled in as Grafana would: every pipeline, the given rate window."""
    dashboard = json.loads(DASHBOARD.read_text())
    fill = {"$__rate_interval": rate_interval, "$pipeline": ".*"}
    queries = [
        (variable["name"], _label_values(variable["definition"]))
        for variable in dashboard["templating"]["list"]
    ]
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = target["expr"]
            for name, value in fill.items():
                expr = expr.replace(name, value)
            queries.append((panel["title"], expr))
    return queries


def _label_values(definition: str) -> str:
    """Grafana's `label_values(metric, label)` as the PromQL that gives those values."""
    found = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", definition)
    assert found, f"not a label_values query: {definition}"
    metric, label = found.groups()
    return f"group by ({label}) ({metric})"


def rules() -> list[dict[str, Any]]:
    """Every recording and alerting rule of deploy/rules/strata.rules.yml."""
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


# A comparison outside label matchers and strings (in which `=`, `!=` and `=~` are matchers).
_COMPARISON = re.compile(r'(\{[^}]*\}|"[^"]*")|(==|!=|>=|<=|>|<)')


def measured(expr: str) -> str:
    """`expr` with each comparison made to answer 0 or 1 (`bool`) instead of dropping the
    series that fail it: what an alert measures, which has series when nothing is wrong."""
    return _COMPARISON.sub(lambda m: m.group(1) or f"{m.group(2)} bool", expr)


_STRINGS = re.compile(r'"[^"]*"')
_METRIC = re.compile(r"\b(strata[_:][a-z0-9_:]+|process_[a-z_]+|up)\b")


def metrics_named(expr: str) -> set[str]:
    """The metric names (Strata's, the process collector's, `up`) an expression reads."""
    return set(_METRIC.findall(_STRINGS.sub('""', expr)))
