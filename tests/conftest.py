"""How the suite is spread over pytest-xdist's workers (`make test` runs `pytest -n N`):
by unit, heaviest first (tests/support/spread.py), whatever `--dist` says. Without xdist the
order is collection's, as ever. Before the workers start, the controller writes pytest's
rewritten test modules once for all of them (tests/support/rewritten.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import rewritten, spread


@pytest.hookimpl(tryfirst=True)  # before xdist starts the workers (its own hook is trylast)
def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    controller = config.getoption("dist", "no") != "no" and not hasattr(config, "workerinput")
    if controller and config.getoption("assertmode") == "rewrite":
        rewritten.write_all(config, Path(__file__).parent)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> spread.Units:
    config.option.loadscopereorder = False  # keep the workers' order: heaviest first
    return spread.Units(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # an xdist worker: heaviest units first
        tests = ((item.nodeid, item.get_closest_marker("slow") is not None) for item in items)
        weights = spread.unit_weights(tests)
        # A stable sort: each unit's tests keep their order.
        items.sort(key=lambda item: weights[spread.unit(item.nodeid)])
