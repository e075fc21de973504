"""One running system shared by the end-to-end tests of a module, and its gateway's address."""

import pytest

from strata.launch import Supervisor
from tests.support.fixtures import system as system  # re-exported: pytest finds fixtures here


@pytest.fixture(scope="module")
def gateway(system: Supervisor) -> str:
    return system.address("gateway")
