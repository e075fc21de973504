"""What a reload applies live (services/gateway/runtime.py) and what needs a restart."""

from services.gateway.runtime import _needs_restart
from strata.config import load_settings
from tests.support.system import DEFAULT_CONFIG


def test_of_telemetry_only_the_sample_ratio_reloads_live() -> None:
    old = load_settings(DEFAULT_CONFIG)

    def with_telemetry(**changes: object):
        return old.model_copy(update={"telemetry": old.telemetry.model_copy(update=changes)})

    assert _needs_restart(old, with_telemetry(sample_ratio=0.25)) == []
    assert _needs_restart(old, with_telemetry(otlp_endpoint="http://127.0.0.1:4317")) == [
        "telemetry"
    ]
