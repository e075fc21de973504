"""One system of the default config for the whole package: its tests only read from it
(valid and hostile requests, no reconfiguring, no load that would move the ladder), so it
starts once. The package is one unit of pytest-xdist's work (tests/support/spread.py), so
one worker runs it all; a test that needs its own system starts one."""

from collections.abc import Iterator

import pytest

from strata.launch import Supervisor
from tests.support.system import running_system


@pytest.fixture(scope="package")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    with running_system(tmp_path_factory.mktemp("default-system")) as supervisor:
        yield supervisor
