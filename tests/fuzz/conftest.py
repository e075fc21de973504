"""One running system for the fuzz suite: its modules only send requests, broken or not, and
check that every answer is a documented one and every process stays up, so one system serves
them all. The package is one unit of pytest-xdist's work (tests/support/spread.py), so it
starts once in the run."""

from collections.abc import Iterator

import pytest

from strata.tools.launch import Supervisor
from tests.support.hostile import MAX_MESSAGE
from tests.support.system import running_system


@pytest.fixture(scope="package")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {"server": {"max_message_bytes": MAX_MESSAGE}}
    with running_system(tmp_path_factory.mktemp("fuzz"), changes) as supervisor:
        yield supervisor
