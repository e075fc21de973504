"""A/B routing (services/gateway/upstream/router.py): weighted and sticky per client, arms
forced by name, weights changed at run time or refused whole, unusable arms routed around,
and the shadow's share of requests."""

import math

import numpy as np
import pytest

from services.gateway.upstream.router import Router
from strata.config.pipelines import Route, Shadow
from strata.errors import InvalidArgument, Unavailable


def routes(a: float = 90, b: float = 10) -> list[Route]:
    return [Route(arm="a", deployment="a", weight=a), Route(arm="b", deployment="b", weight=b)]


def test_split_follows_weights_and_clients_stick() -> None:
    router = Router("digits", routes(), None)
    chosen = [router.choose(f"client-{i}").arm for i in range(10_000)]
    assert chosen.count("b") / len(chosen) == pytest.approx(0.10, abs=0.02)
    assert all(router.choose(f"client-{i}").arm == chosen[i] for i in range(500))


def test_forced_arm_and_unknown_arm() -> None:
    router = Router("digits", routes(100, 0), None)
    assert router.choose("x", forced="b").arm == "b"
    with pytest.raises(InvalidArgument, match="no arm 'zz'"):
        router.choose("x", forced="zz")


def test_weights_change_and_bad_weights_are_refused() -> None:
    router = Router("digits", routes(), None)
    router.set_weights({"a": 0, "b": 1})
    assert {router.choose(f"c{i}").arm for i in range(200)} == {"b"}
    with pytest.raises(InvalidArgument):
        router.set_weights({"b": 0})
    with pytest.raises(InvalidArgument):
        router.set_weights({"c": 1})


@pytest.mark.parametrize(
    ("weights", "says"),
    [
        ({"b": math.nan}, "arm 'b': weight nan"),
        ({"b": -1.0}, "arm 'b': weight -1.0"),
        ({"a": math.inf}, "arm 'a': weight inf"),
        ({"a": 0.0, "b": 0.0}, "add up to a positive finite number"),
        ({"a": 1e308, "b": 1e308}, "add up to a positive finite number"),
        ({"c": 1.0}, "has no arm 'c'; its arms: 'a', 'b'"),
    ],
)
def test_weights_that_cannot_route_are_refused_whole(weights, says) -> None:
    router = Router("p", routes(9, 1), None)
    with pytest.raises(InvalidArgument, match=says):
        router.set_weights(weights)
    assert [r.weight for r in router.routes] == [9, 1]


def test_unusable_arm_falls_back_to_a_healthy_one() -> None:
    router = Router("digits", routes(50, 50), None)
    assert {router.choose(f"c{i}", usable=lambda r: r.arm == "b").arm for i in range(100)} == {"b"}
    with pytest.raises(Unavailable):
        router.choose("c", usable=lambda r: False)


def test_an_arm_whose_model_circuit_is_open_is_routed_around() -> None:
    arms = routes(9, 1)
    router = Router("p", arms, None, available=lambda route: route.deployment != "a")
    assert {router.choose(f"client-{i}").arm for i in range(40)} == {"b"}
    assert router.fallback("client-0", arms[1], lambda route: True) is None


def test_shadow_fraction() -> None:
    router = Router("digits", routes(), Shadow(deployment="b", fraction=0.25))
    share = np.mean([router.mirrors(f"r{i}") for i in range(4000)])
    assert share == pytest.approx(0.25, abs=0.03)
    assert not Router("digits", routes(), None).mirrors("r")
