"""The check of the gateway's control calls (the admin API, model repository control, log
and trace settings; strata.security.bearer.ControlAuth): the configured token as a bearer token, and
the calls off while none is set."""

import grpc
import pytest

from strata.errors import Unauthenticated
from strata.security.bearer import ControlAuth, ControlOff


class Context:
    def __init__(self, *metadata: tuple[str, str]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return "ipv4:10.0.0.1:5000"


def test_a_control_call_needs_the_configured_token() -> None:
    def check(token: str | None, *metadata: tuple[str, str]) -> None:
        ControlAuth("x", "a_token", lambda: token).check(Context(*metadata))

    check("s3cret", ("authorization", "Bearer s3cret"))
    check("s3cret", ("authorization", "bearer s3cret"))
    for metadata in [(), (("authorization", "Bearer wrong"),), (("authorization", "s3cret"),)]:
        with pytest.raises(Unauthenticated) as info:
            check("s3cret", *metadata)
        assert "s3cret" not in str(info.value)
    with pytest.raises(ControlOff, match="set a_token to enable it") as off:
        check(None, ("authorization", "Bearer s3cret"))
    assert off.value.code == grpc.StatusCode.PERMISSION_DENIED
