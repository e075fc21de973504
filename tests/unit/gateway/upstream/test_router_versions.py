"""Failing over a flight whose inputs were prepared for its arm's model version: only to an
arm of the same version where the pipeline's preprocessing differs by version."""

from __future__ import annotations

from services.gateway.upstream.router import Router
from strata.config.pipelines import Route

ROUTES = [
    Route(arm="control", deployment="a", version="1", weight=80),
    Route(arm="canary", deployment="b", version="2", weight=10),
    Route(arm="spare", deployment="c", version="1", weight=10),
]


def down(*deployments: str):
    return lambda route: route.deployment not in deployments


def test_a_prepared_flight_fails_over_only_to_its_version() -> None:
    router = Router("p", ROUTES, None, prepared_per_version=True)
    for client in map(str, range(50)):
        assert router.fallback(client, ROUTES[0], down("a")).arm == "spare"
        assert router.fallback(client, ROUTES[1], down("b")) is None
    assert router.fallback("x", ROUTES[0], down("a", "c")) is None


def test_an_arm_chosen_before_preprocessing_may_be_any_version() -> None:
    router = Router("p", ROUTES, None, prepared_per_version=True)
    chosen = {router.choose(str(c), usable=down("a", "c")).arm for c in range(50)}
    assert chosen == {"canary"}


def test_without_per_version_preprocessing_any_arm_takes_the_flight() -> None:
    router = Router("p", ROUTES, None)
    arms = {router.fallback(str(c), ROUTES[1], down("b")).arm for c in range(50)}
    assert arms == {"control", "spare"}
