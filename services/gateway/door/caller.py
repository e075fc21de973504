"""Who sent a request and how long they will wait, whichever protocol carried it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import grpc

from strata.security import principal

PRINCIPAL = "strata.principal"  # the ASGI scope extension: a client certificate's principal


@dataclass(frozen=True)
class Caller:
    """A request's sender as admission, budgets and metrics see it."""

    metadata: Mapping[str, str]  # gRPC metadata or HTTP headers, names in lower case
    peer: str  # gRPC's form: ipv4:10.0.0.1:5123, ipv6:[::1]:5123
    time_remaining: float | None  # seconds until the caller's deadline; None: none set
    protocol: str = "grpc"
    principal: str | None = None  # whom its verified client certificate names (security.py)


def grpc_caller(context: grpc.aio.ServicerContext) -> Caller:
    """The caller of a gRPC call."""
    names = context.peer_identities() or ()
    return Caller(
        dict(context.invocation_metadata() or ()),
        context.peer(),
        context.time_remaining(),
        principal=principal(name.decode() for name in names),
    )
