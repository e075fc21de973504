"""The REST port's connections: uvicorn's httptools protocol with the limits uvicorn lacks.

uvicorn closes a connection only when it idles after a response: one that connects and never
finishes a request header stays open for good, and its `limit_concurrency` counts idle
connections, so enough of them made even `/v2/health/live` answer 503. Here a request's
header must arrive within `header_timeout` (408, then closed), one address holds at most
`per_client` connections (503, then closed, before anything is read), and the probes answer
past `limit_concurrency`: they are answered at once and hold nothing. A verified client
certificate's principal reaches the app as the scope extension `strata.principal` (its
"name": ASGI makes each extension a dict).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.gateway.door.caller import PRINCIPAL
from strata.errors import RETRY_AFTER
from strata.security.credentials import principal
from strata.security.occupancy import REFUSED, RETRY_AFTER_MS, Shares

PROBES = frozenset({b"/v2/health/live", b"/v2/health/ready"})
REASONS = {408: "Request Timeout", 503: "Service Unavailable"}


@dataclass
class Connections:
    """One REST server's limits: a request header's timeout, and connections per address."""

    header_timeout: float
    per_client: Shares


def client_principal(transport: asyncio.Transport) -> str | None:
    """Whom the connection's verified client certificate names (None without one)."""
    tls = transport.get_extra_info("ssl_object")
    certificate = tls.getpeercert() if tls is not None else None
    if not certificate:
        return None
    names = [value for _kind, value in certificate.get("subjectAltName", ())]
    subject = [pair for rdn in certificate.get("subject", ()) for pair in rdn]
    return principal([*names, *(value for key, value in subject if key == "commonName")])


def refusal(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 response that refuses and closes, in the v2 error form."""
    body = json.dumps({"error": message}).encode()
    # A connection refused for what its address holds may retry once one of them closes.
    hint = f"retry-after: 1\r\n{RETRY_AFTER}: {RETRY_AFTER_MS}\r\n" if status == 503 else ""
    head = (
        f"HTTP/1.1 {status} {REASONS[status]}\r\ncontent-type: application/json\r\n"
        f"{hint}content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


class LimitedProtocol(HttpToolsProtocol):
    """A connection under these limits; `bounds` is set per server (`protocol`)."""

    bounds: Connections  # not `connections`: uvicorn's protocol has its own of that name
    _address: str | None = None
    _principal: str | None = None
    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        address = self.client[0] if self.client else "unknown"
        if not self.bounds.per_client.take(address):
            limit = self.bounds.per_client.limit
            self._refuse(
                "connections_per_client",
                503,
                f"your address holds {limit} open connections, the most one address may",
            )
            return
        self._address = address
        self._principal = client_principal(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._address is not None:
            self.bounds.per_client.give(self._address)
            self._address = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._principal is not None:
            self.scope["extensions"] = {PRINCIPAL: {"name": self._principal}}
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        limit = self.limit_concurrency
        if self.url.split(b"?", 1)[0] in PROBES:
            self.limit_concurrency = None
        try:
            super().on_headers_complete()
        finally:
            self.limit_concurrency = limit

    def _arm(self) -> None:
        self._disarm()
        timeout = self.bounds.header_timeout
        self._header_timer = self.loop.call_later(timeout, self._header_timed_out)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        timeout = self.bounds.header_timeout
        self._refuse("header_timeout", 408, f"no whole request header within {timeout:g}s")

    def _refuse(self, reason: str, status: int, message: str) -> None:
        REFUSED.labels(reason).inc()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # never inside a response
            self.transport.write(refusal(status, message))
        self.transport.close()


def protocol(bounds: Connections) -> type[LimitedProtocol]:
    """The protocol class of one server, holding that server's `bounds`."""
    return type("LimitedProtocol", (LimitedProtocol,), {"bounds": bounds})
