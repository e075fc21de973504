"""Who sent a gRPC call and how long they will wait (the REST API's caller is made in
rest/app.py)."""

from __future__ import annotations

from typing import Any

import grpc

from services.gateway.request import Caller
from strata.security.credentials import principal
from strata.telemetry.propagation import call_metadata

# The ASGI scope extension whose "name" is a client certificate's principal.
PRINCIPAL = "strata.principal"


def grpc_caller(context: grpc.aio.ServicerContext[Any, Any]) -> Caller:
    """The caller of any gRPC call (its context's message types are invariant, so Any)."""
    names = context.peer_identities() or ()
    return Caller(
        call_metadata(context),
        context.peer(),
        context.time_remaining(),
        principal=principal(name.decode() for name in names),
    )
