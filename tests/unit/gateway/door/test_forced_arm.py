"""Forcing an arm (services/gateway/door/forced_arm.py): a capability of API keys; with the
door open, any caller may force an arm that has weight, none one that was rolled back."""

import pytest

from services.gateway.door.forced_arm import ForcedArm
from services.gateway.request import Caller
from services.gateway.upstream.router import Router
from strata.config.gateway import ApiKey
from strata.config.pipelines import Route
from strata.errors import PermissionDenied
from strata.security.credentials import KeyRing, key_hash


def rolled_back() -> Router:
    """Arm a takes all the traffic, arm b none (rolled back)."""
    routes = [Route(arm="a", deployment="a", weight=100), Route(arm="b", deployment="b", weight=0)]
    return Router("digits", routes, None)


def forcing(*keys: tuple[str, list[str]]) -> ForcedArm:
    """The forced-arm policy with API keys each (key, capabilities); none: the door is open."""
    ring = KeyRing([ApiKey(client_id=k, sha256=key_hash(k), capabilities=c) for k, c in keys])
    return ForcedArm({}, ring)


def sent(key: str | None = None) -> Caller:
    return Caller({"x-api-key": key} if key else {}, "ipv4:127.0.0.1:5000", None)


def test_forcing_an_arm_is_a_capability_of_keys() -> None:
    router = rolled_back()
    keyed = forcing(("ops", ["force_arm"]), ("app", []))
    keyed.check(sent("ops"), router, "a")
    keyed.check(sent("ops"), router, "b")  # rolled back: the capability may
    for who in ("app", None):
        with pytest.raises(PermissionDenied, match="granted the 'force_arm' capability"):
            keyed.check(sent(who), router, "a")


def test_with_the_door_open_only_a_weighted_arm_may_be_forced() -> None:
    router = rolled_back()
    forcing().check(sent(), router, "a")
    with pytest.raises(PermissionDenied, match="arm 'b' has weight 0 \\(rolled back\\)"):
        forcing().check(sent(), router, "b")
