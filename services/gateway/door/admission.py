"""The door's one place: each request's caller named, then the admission policies asked in
the order they were built (app.py), at each checkpoint (policy.py).

A policy that refuses ends the request there; the tickets the ones before it gave are given
back at once. The others are given back when the request leaves the chain.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from services.gateway.door.identity import Identity
from services.gateway.door.policy import Checkpoint, Entry, Policy, Ticket
from services.gateway.request import Caller
from strata.config.settings import Settings
from strata.security.credentials import KeyRing


@dataclass(frozen=True)
class Pass:
    """What a request holds from the policies of one checkpoint."""

    tickets: tuple[tuple[Policy, Ticket], ...]


class Admission:
    """The caller's identity and the policies, in order; all reload live."""

    def __init__(self, identity: Identity, policies: Sequence[Policy]) -> None:
        self._identity = identity
        self._policies = {at: [p for p in policies if p.checkpoint is at] for at in Checkpoint}
        self._all = list(policies)

    @property
    def keys(self) -> KeyRing:
        return self._identity.keys

    def identify(self, caller: Caller) -> str:
        """The caller's client key (UNAUTHENTICATED without a valid API key, when required)."""
        return self._identity(caller)

    async def admit(self, entry: Entry, at: Checkpoint) -> Pass:
        """The tickets of every policy at `at`, or the first refusal raised."""
        tickets: list[tuple[Policy, Ticket]] = []
        try:
            for policy in self._policies[at]:
                tickets.append((policy, await policy.admit(entry)))
        except BaseException:
            self.leave(Pass(tuple(tickets)), telling=False)
            raise
        return Pass(tuple(tickets))

    def leave(self, held: Pass, telling: bool) -> None:
        """The request is done; `telling`: its latency says how the chain is doing."""
        for policy, ticket in reversed(held.tickets):
            policy.leave(ticket, telling)

    def configure(self, settings: Settings) -> None:
        self._identity.configure(settings)
        for policy in self._all:
            policy.configure(settings)
