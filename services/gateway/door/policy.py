"""The question every admission policy answers: may this request come in?

A policy is asked at one of two checkpoints: on arrival, before the request is read (who may
call, how often, what they may ask of the routes), or on boarding, once it is valid and the
cache could not answer it, before it takes a place in the chain (how many may be in it). It
answers with a ticket, which it is given back when the request leaves, or refuses by raising
the refusal (a `StrataError`, its status and message for the client). The gateway builds its
policies once, at start (app.py), and asks them in one place (admission.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from services.gateway.request import Caller
from strata.config.settings import Settings
from strata.wire.deadline import Deadline

# What a policy hands out and gets back when the request leaves; None where it holds nothing.
Ticket = Any


class Checkpoint(Enum):
    ARRIVAL = "arrival"  # before the request is read
    BOARDING = "boarding"  # before it takes a place in the chain


@dataclass(frozen=True)
class Entry:
    """A request as the door sees it."""

    caller: Caller | None  # None for a request the gateway's own tests make without one
    pipeline: str
    client: str  # who is calling (identity.py)
    forced_arm: str  # the arm it forces (strata.arm), "" for none
    deadline: Deadline
    level: int = 0  # the ladder's level, set from boarding on


class Policy(Protocol):
    """One admission question, asked at one checkpoint."""

    checkpoint: Checkpoint

    async def admit(self, entry: Entry) -> Ticket:
        """A ticket for the request, or its refusal raised."""
        ...

    def leave(self, ticket: Ticket, telling: bool) -> None:
        """The request is done; `telling`: its latency says how the chain is doing."""
        ...

    def configure(self, settings: Settings) -> None:
        """New settings, live (a reload that applies)."""
        ...
