"""Who is calling: the client key an API key, a client certificate or the caller names.

With API keys configured, a caller is its key's client; without keys but with client
certificates (tls.client_certificates), it is its certificate's principal, whatever client id
it sends. Without either, identity is only what the caller says (a client id, an
unregistered key), so the rate limits (rate_limits.py) limit its peer address too.
"""

from __future__ import annotations

from services.gateway.request import Caller
from strata.config.gateway import RateLimits
from strata.config.settings import Settings
from strata.errors import Unauthenticated
from strata.security.bearer import source_address
from strata.security.credentials import KeyRing, key_hash


def client_key(caller: Caller, limits: RateLimits, keys: KeyRing) -> str:
    """Who is calling: the client id of a valid API key (required when keys are configured),
    else the principal of its client certificate, else a hash of an unregistered key, a
    client id header, or the peer host."""
    metadata = caller.metadata
    key = metadata.get(limits.api_key_header)
    if keys:
        client = keys.client(key)
        if client is None:
            raise Unauthenticated(
                f"a valid API key is required in the {limits.api_key_header!r} metadata"
            )
        return f"id:{client}"
    if caller.principal is not None:
        return f"cert:{caller.principal}"
    if key:
        return "key:" + key_hash(key)[:16]
    client = metadata.get(limits.client_header)
    if client:
        return f"id:{client}"
    return peer_host(caller.peer)


def peer_host(peer: str) -> str:
    """The caller's address without its port, as a client key ("peer:ipv4:10.0.0.1")."""
    return "peer:" + source_address(peer)


class Identity:
    """Names each caller from the configured API keys and headers; both reload live."""

    def __init__(self, settings: Settings) -> None:
        self.configure(settings)

    def configure(self, settings: Settings) -> None:
        self.limits = settings.gateway.rate_limits
        self.keys = KeyRing(settings.gateway.api_keys)

    def __call__(self, caller: Caller) -> str:
        """The caller's client key (UNAUTHENTICATED without a valid API key, when required)."""
        return client_key(caller, self.limits, self.keys)
