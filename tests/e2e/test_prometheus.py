"""The dashboard and the alerts read what the services really export: a real Prometheus
scrapes a running system under a little load (one bad request, one refused), and every
dashboard query and every rule's expression gives series there, none naming a metric that
does not exist. A metric renamed in code fails here instead of blanking a panel."""

from collections.abc import Iterator

import grpc
import pytest

from strata.proto.inference import grpc_service_pb2_grpc as v2_grpc
from tests.support.prometheus import (
    PROMETHEUS,
    Prometheus,
    dashboard_queries,
    measured,
    metrics_named,
    rules,
    running_prometheus,
    send_bad,
    send_load,
    send_refused,
    watched,
)
from tests.support.system import running_system

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="prometheus is not installed (Debian's `prometheus` package): the dashboard's and "
    "the alerts' queries were not checked against a real Prometheus",
)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    folder = tmp_path_factory.mktemp("prometheus")
    with (
        running_system(folder, watched) as system,
        running_prometheus(folder, system.settings) as prometheus,
    ):
        stub = v2_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(system.address("gateway")))
        send_load(stub, 40)
        send_bad(stub)
        send_refused(stub)
        # The refusal scraped, and each recording rule evaluated.
        prometheus.wait_for('strata_gateway_requests_total{code="RESOURCE_EXHAUSTED"}')
        for rule in rules():
            prometheus.wait_for(rule.get("record", "up"))
        yield prometheus


def test_every_process_is_scraped(prometheus: Prometheus) -> None:
    up = {
        (s["metric"]["job"], s["metric"]["instance"]): s["value"][1] for s in prometheus.query("up")
    }
    jobs = sorted(job for job, _ in up)
    assert jobs == ["gateway", "inference", "inference", "postprocess", "preprocess", "preprocess"]
    assert set(up.values()) == {"1"}, up


def test_every_rule_loads_and_evaluates(prometheus: Prometheus) -> None:
    loaded = [r for g in prometheus.get("/api/v1/rules")["groups"] for r in g["rules"]]
    assert sorted(r["name"] for r in loaded) == sorted(
        r.get("record") or r["alert"] for r in rules()
    )
    assert {(r["name"], r["health"], r.get("lastError", "")) for r in loaded} == {
        (r["name"], "ok", "") for r in loaded
    }


def test_every_rule_expression_gives_series(prometheus: Prometheus) -> None:
    empty = [
        rule.get("record") or rule["alert"]
        for rule in rules()
        if not prometheus.query(measured(rule["expr"]))
    ]
    assert not empty, f"no series for the rules {empty}"


def test_every_dashboard_query_gives_series(prometheus: Prometheus) -> None:
    empty = [
        (title, expr) for title, expr in dashboard_queries("30s") if not prometheus.query(expr)
    ]
    assert not empty, "no series for:\n" + "\n".join(f"{t}: {e}" for t, e in empty)


def test_no_query_names_a_metric_that_does_not_exist(prometheus: Prometheus) -> None:
    exprs = [expr for _, expr in dashboard_queries("30s")] + [r["expr"] for r in rules()]
    named = set().union(*(metrics_named(expr) for expr in exprs))
    assert named, "no metric names found in the queries"
    unknown = named - prometheus.known_metrics()
    assert not unknown, f"the queries name metrics nothing exports: {sorted(unknown)}"


def test_the_bad_and_the_refused_requests_show(prometheus: Prometheus) -> None:
    codes = {
        s["metric"]["code"]
        for s in prometheus.query("sum by (code) (strata_gateway_requests_total)")
    }
    assert {"OK", "INVALID_ARGUMENT", "RESOURCE_EXHAUSTED"} <= codes
    refusals = prometheus.query("sum by (scope) (strata_gateway_rate_limited_total)")
    assert [s["metric"]["scope"] for s in refusals] == ["client"]
