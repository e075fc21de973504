"""One system of the default config for the whole package: its tests only read from it
(valid and hostile requests, no reconfiguring, no load of their own), so it starts once. The
package is one unit of pytest-xdist's work (tests/support/spread.py), so one worker runs it
all; a test that needs its own system starts one. The ladder stays at level 0: on a machine
busy with the other workers it could climb and change the answers these tests compare."""

from collections.abc import Iterator

import pytest

from strata.tools.launch import Supervisor
from tests.support.system import running_system


@pytest.fixture(scope="package")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {"gateway": {"ladder": {"max_level": 0}}}
    with running_system(tmp_path_factory.mktemp("default-system"), changes) as supervisor:
        yield supervisor
