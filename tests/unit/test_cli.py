"""strata.rpc.main: the event loop a service runs on."""

import pytest
import uvloop

from strata.config import load_settings
from strata.rpc.main import _loop_factory
from tests.support.system import DEFAULT_CONFIG


def test_services_run_on_uvloop_unless_the_config_says_asyncio(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _loop_factory(load_settings(DEFAULT_CONFIG)) is uvloop.new_event_loop
    monkeypatch.setenv("STRATA_SERVER__EVENT_LOOP", "asyncio")
    assert _loop_factory(load_settings(DEFAULT_CONFIG)) is None
