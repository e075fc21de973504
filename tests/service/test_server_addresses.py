"""Every address a server of strata.rpc.server binds is its own while it runs and free again
once it stops: a second server asked for a port in use fails to start and says so, never
shares the port (gRPC's SO_REUSEPORT, on by default, would let it), and a stopped server
leaves nothing bound, its plaintext probe port included. An in-process world that loses a
port before binding it starts again on new ones, leaving none of the first try's bound."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from strata.config import load_settings
from strata.config.server import ServerSettings
from strata.config.tls import TlsSettings
from strata.process.exits import AddressUnusable, bind_problem
from strata.rpc import server as rpc_server
from strata.rpc.server import start_server
from tests.support import inprocess
from tests.support.system import free_port, make_config


def address() -> str:
    return f"127.0.0.1:{free_port()}"


async def start_twice(listen: str) -> None:
    first = await start_server([], listen, ServerSettings())
    try:
        await start_server([], listen, ServerSettings())
    finally:
        await first.stop(0)


def test_a_second_server_on_a_port_in_use_fails_to_start_and_says_so() -> None:
    listen = address()
    with pytest.raises(AddressUnusable, match=f"{listen} \\(listen\\) already in use"):
        asyncio.run(start_twice(listen))


def test_the_port_is_refused_by_the_bind_itself_not_only_by_the_check_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The check before the bind can be passed by a server that binds a moment later: gRPC's
    own bind must then fail too, and with SO_REUSEPORT it would not."""
    monkeypatch.setattr(rpc_server, "bind_problem", lambda _: None)
    with pytest.raises(AddressUnusable):
        asyncio.run(start_twice(address()))


def test_a_stopped_server_leaves_its_listen_and_probe_ports_free() -> None:
    listen, probe = address(), address()

    async def start_and_stop() -> None:
        running = await start_server([], listen, ServerSettings(), TlsSettings(probe_listen=probe))
        assert bind_problem(listen) == bind_problem(probe) == "already in use"
        await running.stop(0)

    asyncio.run(start_and_stop())
    assert bind_problem(listen) is None
    assert bind_problem(probe) is None


def test_a_world_that_loses_a_port_starts_on_new_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written = []

    def config_whose_postprocess_port_is_taken(folder: Path, changes: dict | None) -> Path:
        path = make_config(folder, changes)
        written.append(load_settings(path).services)
        if len(written) == 1:
            port = int(written[0].postprocess.listen.rpartition(":")[2])
            taken.bind(("127.0.0.1", port))
            taken.listen()
        return path

    with socket.socket() as taken:
        monkeypatch.setattr(inprocess, "make_config", config_whose_postprocess_port_is_taken)
        with inprocess.servers_in_process(tmp_path) as world:
            assert world.settings.services == written[1]
        lost = written[0]
        started = [*lost.preprocess.listens, *(e.listen for e in lost.inference.values())]
        assert all(bind_problem(address) is None for address in started)
