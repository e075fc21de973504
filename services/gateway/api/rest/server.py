"""uvicorn serving the REST API on the gateway's own event loop, beside the gRPC server.

uvicorn's `serve()` takes over SIGTERM and SIGINT; the gateway's shutdown is strata.rpc.server's
(health NOT_SERVING first, then drain), so this runs uvicorn's start-up, tick loop and
graceful shutdown itself and leaves the signals alone. Connections are uvicorn's httptools
protocol under the connection limits (rest/connections.py).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import TypedDict

import uvicorn
from starlette.types import ASGIApp

from services.gateway.api.rest.connections import Connections, protocol
from strata.config.gateway import Rest
from strata.config.server import ServerSettings
from strata.config.tls import CA, CERT, KEY, TlsSettings, public_identity
from strata.process.exits import AddressUnusable
from strata.process.workers import reuse_port_socket, sharing
from strata.security.occupancy import Shares

log = logging.getLogger(__name__)


class _Certificate(TypedDict, total=False):
    """The keyword arguments of uvicorn.Config that set TLS."""

    ssl_certfile: str
    ssl_keyfile: str
    ssl_ca_certs: str
    ssl_cert_reqs: int


def _certificate(tls: TlsSettings, identity: str) -> _Certificate:
    """uvicorn's TLS settings: the public certificate the gRPC port presents, and a client
    certificate required as there (`tls.client_certificates`)."""
    if not tls.enabled:
        return {}
    assert tls.certs is not None  # TlsSettings requires it once enabled
    folder = tls.certs / public_identity(identity)
    certificate: _Certificate = {
        "ssl_certfile": str(folder / CERT),
        "ssl_keyfile": str(folder / KEY),
    }
    if tls.client_certificates:
        certificate["ssl_ca_certs"] = str(folder / CA)
        certificate["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return certificate


class RestServer:
    """An ASGI app on `listen`: `start()` binds and serves, `stop(grace)` drains."""

    def __init__(
        self,
        app: ASGIApp,
        listen: str,
        settings: ServerSettings,
        tls: TlsSettings,
        identity: str,
        rest: Rest,
    ) -> None:
        host, _, port = listen.rpartition(":")
        certificate = _certificate(tls, identity)
        per_client = Shares(settings.max_calls_per_client)
        connections = Connections(rest.header_timeout_seconds, per_client)
        self._config = uvicorn.Config(
            app,
            host=host,
            port=int(port),
            http=protocol(connections),
            ws="none",
            lifespan="off",
            log_config=None,
            access_log=False,
            server_header=False,
            # X-Forwarded-For only from the proxies configured (uvicorn trusts loopback's).
            proxy_headers=bool(rest.forwarded_allow_ips),
            forwarded_allow_ips=list(rest.forwarded_allow_ips),
            limit_concurrency=settings.max_concurrent_rpcs,
            timeout_graceful_shutdown=int(settings.grace_seconds) or 1,
            **certificate,
        )
        self._server = uvicorn.Server(self._config)
        self._ticking: asyncio.Task[None] | None = None
        self.listen = listen

    async def start(self) -> None:
        self._config.load()
        self._server.lifespan = self._config.lifespan_class(self._config)
        # A worker shares the port with its siblings (strata.process.workers; its parent claimed
        # it).
        sockets = [reuse_port_socket(self.listen)] if sharing() else None
        try:
            await self._server.startup(sockets)
        except SystemExit:  # uvicorn's answer to a port it cannot bind
            raise AddressUnusable(self.listen, "REST") from None
        self._ticking = asyncio.create_task(self._server.main_loop())
        log.info("serving the v2 REST API on %s", self.listen)

    async def stop(self, grace: float) -> None:
        """Stop accepting connections, let requests in flight finish within `grace`."""
        if self._ticking is None:
            return
        self._server.should_exit = True
        await self._ticking
        await self._server.shutdown()
