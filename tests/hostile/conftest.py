"""One running system for the hostile-input suite, and a channel to each of its ports."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from strata.tools.launch import Supervisor
from tests.support.system import free_port, running_system

MAX_MESSAGE = 1 << 20


@pytest.fixture(scope="package")
def system(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervisor]:
    changes = {
        # Good and bad requests go out together on one connection, to share flights.
        "server": {"max_message_bytes": MAX_MESSAGE},
        # A level would change good answers under the tests' feet; the ladder has its own.
        "gateway": {"ladder": {"max_level": 0}},
        "services": {"gateway": {"metrics": f"127.0.0.1:{free_port()}"}},
    }
    with running_system(tmp_path_factory.mktemp("hostile"), changes) as supervisor:
        yield supervisor


@pytest.fixture(scope="package")
def channels(system: Supervisor) -> Iterator[dict[str, grpc.Channel]]:
    """A channel to each instance, by name (gateway, inference-a, preprocess-0, ...)."""
    options = [
        ("grpc.max_send_message_length", 8 * MAX_MESSAGE),
        ("grpc.max_receive_message_length", 8 * MAX_MESSAGE),
    ]
    opened = {
        name: grpc.insecure_channel(system.address(name), options=options)
        for name in system.instances
    }
    yield opened
    for channel in opened.values():
        channel.close()
