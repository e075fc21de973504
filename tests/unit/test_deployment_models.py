"""Models per inference deployment: what each loads (its routes' models, or a list it is
given), the config refusing a route to a deployment without its model, and the deployment's
name on an inference process's logs and spans."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from opentelemetry import trace

from strata.config import ConfigError, load_settings
from strata.telemetry import tracing
from strata.telemetry.tracing import JsonFormatter
from tests.support.system import make_config

CANARY_WINE = {
    "pipelines": {
        "tabular": {
            "model": {
                "routes": [
                    {"arm": "control", "deployment": "a", "version": "1", "weight": 90},
                    {"arm": "canary", "deployment": "b", "version": "1", "weight": 10},
                ]
            }
        }
    }
}


def loads(tmp_path: Path, changes: dict) -> dict[str, list[str]]:
    settings = load_settings(make_config(tmp_path, changes))
    return {d: settings.models_of(d) for d in settings.services.inference}


@pytest.mark.parametrize(
    ("changes", "loaded"),
    [
        ({}, {"a": ["digits", "digits-large", "tabular"], "b": ["digits"]}),
        (
            {"pipelines": {"digits": {"model": {"shadow": {"deployment": "b"}, "routes": []}}}},
            {"a": ["digits", "digits-large", "tabular"], "b": ["digits"]},
        ),
        (CANARY_WINE, {"a": ["digits", "digits-large", "tabular"], "b": ["digits", "tabular"]}),
        (
            {"inference": {"models": ["digits", "tabular", "digits-large"]}},
            {d: ["digits", "tabular", "digits-large"] for d in "ab"},
        ),
        (
            {"inference": {"models": {"b": ["digits", "tabular"]}}},
            {"a": ["digits", "digits-large", "tabular"], "b": ["digits", "tabular"]},
        ),
    ],
)
def test_each_deployment_loads_what_its_routes_name_or_its_list(
    tmp_path: Path, changes: dict, loaded: dict
) -> None:
    assert loads(tmp_path, changes) == loaded


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ({"b": ["tabular"]}, "routes to deployment 'b', which does not load model 'digits'"),
        (["tabular"], "routes to deployment 'a', which does not load model 'digits'"),
        ({"c": ["digits"]}, "inference.models names deployment 'c', not one of"),
    ],
)
def test_a_route_to_a_deployment_without_its_model_is_refused(
    tmp_path: Path, models: object, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_settings(make_config(tmp_path, {"inference": {"models": models}}))


def test_an_inference_process_serves_the_deployment_it_listens_for(tmp_path: Path) -> None:
    config = make_config(tmp_path)
    settings = load_settings(config)
    b = settings.services.inference["b"].listen
    assert load_settings(config, "inference", b).deployment == "b"
    assert load_settings(config, "inference").deployment == "a"  # no --listen: the first


def test_log_lines_name_the_deployment() -> None:
    record = logging.LogRecord("services.inference.manager", logging.INFO, "", 0, "up", (), None)
    line = json.loads(JsonFormatter("inference", "b").format(record))
    assert (line["service"], line["deployment"]) == ("inference", "b")
    assert "deployment" not in json.loads(JsonFormatter("preprocess").format(record))


def test_spans_carry_the_deployment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace, "set_tracer_provider", lambda provider: None)
    provider = tracing.setup_tracing("strata-inference", None, 1.0, True, "b")
    attributes = provider.resource.attributes
    assert attributes["service.name"] == "strata-inference"
    assert attributes[tracing.DEPLOYMENT_ATTRIBUTE] == "b"
