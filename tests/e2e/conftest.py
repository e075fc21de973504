"""One running system shared by the end-to-end tests of a module."""

from collections.abc import Iterator

import pytest

from strata.launch import Supervisor
from tests.support.system import running_system


@pytest.fixture(scope="module")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with running_system(tmp_path_factory.mktemp("system")) as supervisor:
        yield supervisor


@pytest.fixture(scope="module")
def gateway(system: Supervisor) -> str:
    return system.address("gateway")
