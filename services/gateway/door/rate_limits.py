"""The rate limits as an admission policy: each client's token buckets, and its peer's too
where only the caller says who it is (identity.py)."""

from __future__ import annotations

from services.gateway.door.identity import peer_host
from services.gateway.door.limiter import RateLimiter
from services.gateway.door.policy import Checkpoint, Entry, Ticket
from services.gateway.door.refusals import Refusals
from services.gateway.metrics import RATE_LIMITED
from strata.config.settings import Settings
from strata.errors import Overloaded
from strata.security.credentials import KeyRing


class RateLimit:
    """Refuses a request its client's (or peer's) token bucket has no token for, counted
    and logged with the door's other refusals (reason `rate_limit_<scope>`)."""

    checkpoint = Checkpoint.ARRIVAL

    def __init__(self, settings: Settings, refusals: Refusals) -> None:
        self.limiter = RateLimiter(settings.gateway.rate_limits)
        self.keys = KeyRing(settings.gateway.api_keys)
        self.refusals = refusals

    def configure(self, settings: Settings) -> None:
        self.limiter.configure(settings.gateway.rate_limits)
        self.keys = KeyRing(settings.gateway.api_keys)

    async def admit(self, entry: Entry) -> Ticket:
        caller = entry.caller
        peer = None  # where no key names the caller, its address is limited as well
        if not self.keys and caller is not None and caller.principal is None:
            peer = peer_host(caller.peer)
        admitted, wait, scope = self.limiter.admit(entry.client, peer)
        if not admitted:
            RATE_LIMITED.labels(scope).inc()
            message = f"rate limit ({scope}) exceeded; retry in {wait:.3f}s"
            self.refusals.record(f"rate_limit_{scope}", entry.client, message)
            raise Overloaded(message, wait)
        return None

    def leave(self, ticket: Ticket, telling: bool) -> None:
        return None
