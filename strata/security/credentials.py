"""TLS on every hop, callers admitted by identity, and API keys at the gateway.

With `tls.enabled`, every process presents the certificate of its own identity, read from a
folder per identity under `tls.certs` (tls.crt, tls.key, and ca.crt: the CA its peers'
certificates must chain to), the layout `make certs` writes and a Kubernetes TLS Secret mounts.
A certificate's identity is its SPIFFE ID, spiffe://strata/NAME.

Internal layers (preprocess, inference, postprocess) require mutual TLS and, on every RPC,
admit only the identities `tls.allowed_clients` lists for them (the gateway); health checks
admit any certificate the CA signed, so each container can check itself. The gateway's public
port presents `gateway-public` and asks clients for a certificate only with
`tls.client_certificates` (whose principal is then the client's identity); otherwise clients
authenticate with API keys. Its channels to the layers present `gateway`.
Plaintext only when the config says so, for local development.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import sys
from collections.abc import Callable, Iterable
from typing import Any

import grpc

from strata.config.gateway import ApiKey
from strata.config.tls import CA, CERT, GATEWAY, KEY, TlsSettings, public_identity
from strata.security.occupancy import Gate, around_methods

log = logging.getLogger(__name__)

TRUST_DOMAIN = "strata"


def spiffe_id(identity: str) -> str:
    """The URI a certificate of `identity` carries as a subject alternative name."""
    return f"spiffe://{TRUST_DOMAIN}/{identity}"


def server_credentials(
    tls: TlsSettings, identity: str, public: bool
) -> grpc.ServerCredentials | None:
    """None for plaintext; server-only TLS for a public server, unless it requires client
    certificates (`tls.client_certificates`); mutual TLS otherwise."""
    if not tls.enabled:
        return None
    name = public_identity(identity) if public else identity
    mutual = not public or tls.client_certificates
    return grpc.ssl_server_credentials(
        [(tls.pem(name, KEY), tls.pem(name, CERT))],
        root_certificates=tls.pem(name, CA) if mutual else None,
        require_client_auth=mutual,
    )


def principal(names: Iterable[str]) -> str | None:
    """Whom a verified certificate names: its SPIFFE ID, else its first name; None without."""
    names = list(names)
    spiffe = [name for name in names if name.startswith("spiffe://")]
    chosen = spiffe or names
    return chosen[0] if chosen else None


def channel_credentials(
    tls: TlsSettings, identity: str = GATEWAY
) -> grpc.ChannelCredentials | None:
    """None for plaintext; otherwise verify servers by the CA and present `identity`."""
    if not tls.enabled:
        return None
    return grpc.ssl_channel_credentials(
        root_certificates=tls.pem(identity, CA),
        private_key=tls.pem(identity, KEY),
        certificate_chain=tls.pem(identity, CERT),
    )


def channel_options(tls: TlsSettings) -> list[tuple[str, str]]:
    if tls.enabled and tls.server_name:
        return [("grpc.ssl_target_name_override", tls.server_name)]
    return []


Guard = Callable[[object, str], object]


def caller_guard(tls: TlsSettings, identity: str, public: bool) -> Guard:
    """What a server wraps each servicer with: under TLS, an internal server's methods first
    refuse callers `tls.allowed_clients` does not list for `identity`; otherwise the servicer
    is left as it is."""
    if not tls.enabled or public:
        return lambda servicer, _service: servicer
    names = sorted(tls.allowed_clients.get(identity, []))
    if not names:
        log.warning("%s admits no callers: tls.allowed_clients lists none for it", identity)
    allowed = frozenset(spiffe_id(name).encode() for name in names)
    refusal = f"{identity} admits only callers {names}; this caller's certificate is "

    async def check(context: grpc.aio.ServicerContext[Any, Any]) -> None:
        ids = context.peer_identities() or ()
        if allowed.isdisjoint(ids):
            mine = [i.decode() for i in ids if i.startswith(b"spiffe:")]
            detail = refusal + (", ".join(mine) or "no Strata identity")
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, detail)

    return lambda servicer, service: around_methods(servicer, service, Gate(check))


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyRing:
    """Looks an API key up by its hash; the key itself is never kept or logged."""

    def __init__(self, keys: list[ApiKey]) -> None:
        self._by_hash = {k.sha256: k for k in keys}

    def __bool__(self) -> bool:
        return bool(self._by_hash)

    def client(self, key: str | None) -> str | None:
        """The client id of `key`, or None when it is missing or unknown."""
        found = self._by_hash.get(key_hash(key)) if key else None
        return found.client_id if found else None

    def capabilities(self, key: str | None) -> frozenset[str]:
        """What `key` is granted beyond inference (none when it is missing or unknown)."""
        found = self._by_hash.get(key_hash(key)) if key else None
        return frozenset(found.capabilities) if found else frozenset()


def main() -> None:
    """Print a new API key for CLIENT_ID and the config line that admits it."""
    client = sys.argv[1] if len(sys.argv) > 1 else "client"
    key = secrets.token_urlsafe(32)
    print(f"key (give to the client, never store): {key}")
    print(f"config:  - {{client_id: {client}, sha256: {key_hash(key)}}}")


if __name__ == "__main__":
    main()
