"""The alerting rules: promtool's unit tests pass (where promtool is installed), every alert
has a case where it fires and one where it does not, names what fired and links its runbook,
and the dashboard reads the data source the compose file provisions."""

import json
import re
import shutil
import subprocess

import pytest
import yaml

from tests.support.prometheus import DASHBOARD, DEPLOY, RULES, SHIPPED_CONFIG, rules
from tests.support.system import ROOT

PROMTOOL = shutil.which("promtool")
RULE_TESTS = RULES.with_name("strata.rules.test.yml")
OPERATING = ROOT / "docs" / "operating.md"
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool is not installed (Debian's `prometheus` package): the alert rules' unit "
    "tests did not run",
)


def alerts() -> list[dict]:
    return [rule for rule in rules() if "alert" in rule]


@needs_promtool
def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run(
        [PROMTOOL, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@needs_promtool
def test_the_shipped_prometheus_config_and_rules_check() -> None:
    done = subprocess.run(
        [PROMTOOL, "check", "config", str(SHIPPED_CONFIG)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    cases = [
        case
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in alerts():
        name = alert["alert"]
        mine = [case for case in cases if case["alertname"] == name]
        assert any(case["exp_alerts"] for case in mine), f"{name} is never tested firing"
        assert any(not case["exp_alerts"] for case in mine), f"{name} is never tested quiet"


def test_every_alert_names_what_fired_and_links_its_runbook() -> None:
    # GitHub's anchor of a heading `### StrataLatencyHigh` is `#stratalatencyhigh`.
    headings = re.findall(r"^### (\w+)$", OPERATING.read_text(), re.MULTILINE)
    anchors = {heading.lower() for heading in headings}
    for alert in alerts():
        text = alert["annotations"]
        assert "{{ $labels." in text["summary"], f"{alert['alert']}: its summary names nothing"
        assert text["description"].startswith("Look first at"), alert["alert"]
        page, _, anchor = text["runbook_url"].partition("#")
        assert page == "docs/operating.md" and anchor in anchors, alert["alert"]


def test_the_dashboard_reads_the_provisioned_data_source() -> None:
    provisioned = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    uid = provisioned["datasources"][0]["uid"]
    dashboard = json.loads(DASHBOARD.read_text())
    sources = {panel["datasource"]["uid"] for panel in dashboard["panels"]}
    sources |= {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert sources == {uid}
