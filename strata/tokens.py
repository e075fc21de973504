"""Bearer tokens for the control calls: the gateway's Admin API, inference's model load/unload.

A control call must carry the configured token as `authorization: Bearer <token>` metadata;
it is compared in constant time and never logged. Where no token is configured, the calls are
off (closed by default).
"""

from __future__ import annotations

import hmac

import grpc

from strata.errors import PermissionDenied, Unauthenticated


class ControlOff(PermissionDenied):
    """A control call this server's config does not enable: no caller may make it."""


def authorize(
    context: grpc.aio.ServicerContext, token: str | None, calls: str, setting: str
) -> None:
    """Let the call through only if it carries `token`.

    PERMISSION_DENIED, naming the `setting` that enables `calls`, when no token is
    configured; UNAUTHENTICATED when the call's token is missing or wrong.
    """
    if not token:
        raise ControlOff(
            f"{calls} is off on this server: set {setting} to enable it, and send the token "
            "as 'authorization: Bearer <token>' metadata"
        )
    metadata = dict(context.invocation_metadata() or ())
    scheme, _, sent = metadata.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent.encode(), token.encode()):
        raise Unauthenticated(f"{calls}: missing or wrong admin token")
