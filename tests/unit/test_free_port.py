"""tests/support/system.py's port allocator: the ports one system is given never overlap,
however long the worker has been handing them out, and a port something holds is passed over."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from strata.config import load_settings
from tests.support import system
from tests.support.system import PortSlice, bindable, make_config

FIRST = 12000
# What make_config takes for one system: gateway, REST, two preprocess replicas, postprocess,
# inference a and b.
ONE_SYSTEM = (1, 1, 2, 1, 1, 1)


def all_free(ports: range) -> bool:
    return True


def system_ports(ports: PortSlice) -> list[int]:
    taken = []
    for count in ONE_SYSTEM:
        base = ports.take(count)
        taken += range(base, base + count)
    return taken


def test_no_system_is_given_a_port_twice_lap_after_lap() -> None:
    """A slice the blocks do not divide evenly, started near its end: the lap comes in the
    middle of a system, and then in every place a system can have it."""
    ports = PortSlice(FIRST, 23, start=19, free=all_free)
    for _ in range(5 * 23):
        taken = system_ports(ports)
        assert len(set(taken)) == len(taken), f"a port given twice: {taken}"
        assert all(FIRST <= port < FIRST + 23 for port in taken)


def test_each_port_of_a_slice_comes_round_once_a_lap() -> None:
    ports = PortSlice(FIRST, 20, free=all_free)
    singles = [ports.take() for _ in range(10)]
    pairs = [port + i for port in (ports.take(2) for _ in range(5)) for i in (0, 1)]
    assert sorted(singles + pairs) == list(range(FIRST, FIRST + 20))


def test_a_port_something_holds_is_passed_over() -> None:
    held = {FIRST + 5, FIRST + 8}
    ports = PortSlice(FIRST, 20, start=5, free=lambda block: not held & set(block))
    assert [ports.take(), ports.take(2), ports.take()] == [FIRST + 6, FIRST + 9, FIRST + 11]


def test_a_port_a_socket_listens_on_is_not_bindable() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert not bindable(range(port, port + 1))


def test_the_configs_written_across_the_lap_name_each_address_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every address of every replica (and the REST port) of two configs written back to
    back across the end of the worker's slice, as a long worker writes them."""
    ports = PortSlice(system._FIRST, system._SLICE, start=system._SLICE - 3)
    monkeypatch.setattr(system, "_PORTS", ports)
    addresses = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        services = load_settings(make_config(tmp_path / name)).services
        endpoints = [services.gateway, services.preprocess, services.postprocess]
        addresses += [a for e in [*endpoints, *services.inference.values()] for a in e.listens]
        addresses.append(services.gateway.rest)
    assert len(set(addresses)) == len(addresses), sorted(addresses)
