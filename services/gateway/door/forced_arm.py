"""Forcing an A/B arm (`strata.arm`) as an admission policy: a capability.

With API keys, only a key granted `force_arm` may force an arm; without keys (the door open,
local development) any caller may force an arm that takes traffic. A rolled-back arm
(weight 0) is forced only with the capability.
"""

from __future__ import annotations

from collections.abc import Mapping

from services.gateway.door.policy import Checkpoint, Entry, Ticket
from services.gateway.request import Caller
from services.gateway.upstream.router import Router
from strata.config.gateway import RateLimits
from strata.config.settings import Settings
from strata.errors import PermissionDenied, shown
from strata.security.credentials import KeyRing

ARM_PARAMETER = "strata.arm"
FORCE_ARM = "force_arm"
DEFAULT_HEADER = RateLimits().api_key_header


class ForcedArm:
    """Refuses a forced arm to a caller without the capability it needs."""

    checkpoint = Checkpoint.ARRIVAL

    def __init__(
        self, routers: Mapping[str, Router], keys: KeyRing, header: str = DEFAULT_HEADER
    ) -> None:
        self._routers = routers
        self.keys = keys
        self.header = header  # where a caller's API key comes

    def configure(self, settings: Settings) -> None:
        self.header = settings.gateway.rate_limits.api_key_header
        self.keys = KeyRing(settings.gateway.api_keys)

    async def admit(self, entry: Entry) -> Ticket:
        router = self._routers.get(entry.pipeline)  # none: NOT_FOUND comes after the door
        if entry.forced_arm and entry.caller is not None and router is not None:
            self.check(entry.caller, router, entry.forced_arm)
        return None

    def leave(self, ticket: Ticket, telling: bool) -> None:
        return None

    def check(self, caller: Caller, router: Router, arm: str) -> None:
        """PERMISSION_DENIED unless the caller may force `arm` of `router`'s pipeline."""
        key = caller.metadata.get(self.header)
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
