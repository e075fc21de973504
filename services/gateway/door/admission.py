"""Who is calling and whether they may: identity, API keys and token buckets, at the door.

With API keys configured, a caller is its key's client and is limited as that client alone;
without keys but with client certificates (tls.client_certificates), it is its certificate's
principal, whatever client id it sends. Without either, identity is only what the caller
says (a client id, an unregistered key), so its peer address (the host, without the port) is
limited too: rotating ids does not escape.

Forcing an A/B arm (`strata.arm`) is a capability: with API keys, only a key granted
`force_arm` may; without keys (the door open, local development) any caller may force an
arm that takes traffic. A rolled-back arm (weight 0) is forced only with the capability.
"""

from __future__ import annotations

from services.gateway.door.caller import Caller
from services.gateway.door.limiter import RateLimiter
from services.gateway.metrics import RATE_LIMITED
from services.gateway.upstream.router import Router
from strata.config.gateway import RateLimits
from strata.errors import Overloaded, PermissionDenied, Unauthenticated, shown
from strata.security import KeyRing, key_hash
from strata.tokens import source_address

ARM_PARAMETER = "strata.arm"
FORCE_ARM = "force_arm"


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


class Admission:
    """Identifies each caller and applies the rate limits; keys and limits reload live."""

    def __init__(self, limiter: RateLimiter, keys: KeyRing) -> None:
        self.limiter = limiter
        self.keys = keys

    def configure(self, limits: RateLimits, keys: KeyRing) -> None:
        """New rate limits and API keys, live."""
        self.limiter.configure(limits)
        self.keys = keys

    def identify(self, caller: Caller) -> str:
        """The caller's client key (UNAUTHENTICATED without a valid API key, when required)."""
        return client_key(caller, self.limiter.limits, self.keys)

    def admit(self, caller: Caller) -> str:
        """The caller's client key, once its token buckets allow the request."""
        client = self.identify(caller)
        authenticated = self.keys or caller.principal is not None
        peer = None if authenticated else peer_host(caller.peer)
        admitted, wait, scope = self.limiter.admit(client, peer)
        if not admitted:
            RATE_LIMITED.labels(scope).inc()
            raise Overloaded(f"rate limit ({scope}) exceeded; retry in {wait:.3f}s", wait)
        return client

    def check_forced_arm(self, caller: Caller, router: Router, arm: str) -> None:
        """PERMISSION_DENIED unless the caller may force `arm` of `router`'s pipeline."""
        key = caller.metadata.get(self.limiter.limits.api_key_header)
        granted = FORCE_ARM in self.keys.capabilities(key)
        if self.keys and not granted:
            raise PermissionDenied(
                f"forcing an arm ({ARM_PARAMETER}) needs an API key granted the {FORCE_ARM!r} "
                "capability, and this one is not"
            )
        if not granted and any(r.arm == arm and r.weight == 0 for r in router.routes):
            raise PermissionDenied(
                f"pipeline {router.pipeline!r} arm {shown(arm)} has weight 0 (rolled back): "
                f"only an API key granted the {FORCE_ARM!r} capability may force it"
            )
