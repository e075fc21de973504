"""Fixtures shared by the suites that run the whole system; their conftests import them."""

from collections.abc import Iterator

import pytest

from strata.tools.launch import Supervisor
from tests.support.system import running_system


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    """The system of the default config, started (and ready) for a module, then stopped."""
    with running_system(tmp_path_factory.mktemp("system")) as supervisor:
        yield supervisor
