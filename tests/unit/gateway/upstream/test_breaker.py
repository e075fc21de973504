"""Circuit breakers (services/gateway/upstream/breaker.py): a hop's opens after failures,
fails fast, probes one call at a time; a deployment's circuit per model opens alone."""

import grpc

from services.gateway.upstream.breaker import Breakers, CircuitBreaker
from strata.config.gateway import Breaker
from tests.support.clock import Clock


def test_breaker_opens_fails_fast_and_probes() -> None:
    clock = Clock()
    breaker = CircuitBreaker("up", Breaker(failures=3, open_seconds=2), clock)
    for _ in range(3):
        assert breaker.allow()
        breaker.record(grpc.StatusCode.UNAVAILABLE)
    assert breaker.state == "open" and not breaker.allow()
    clock.now += 2
    assert breaker.allow() and not breaker.allow(), "one probe at a time"
    breaker.record(grpc.StatusCode.UNAVAILABLE)
    assert breaker.state == "open"
    clock.now += 2
    assert breaker.allow()
    breaker.record(grpc.StatusCode.INVALID_ARGUMENT)  # it answered: it is up
    assert breaker.state == "closed"
    breaker.record(grpc.StatusCode.DEADLINE_EXCEEDED)
    assert breaker.state == "closed"


def test_a_model_circuit_opens_alone() -> None:
    breakers = Breakers("inference-a", Breaker(failures=2, open_seconds=5), lambda: 0.0)
    assert breakers.available_for("digits") and breakers.state("digits") == "closed"
    breakers["tabular"].record(grpc.StatusCode.OK)
    for _ in range(2):
        breakers["digits"].record(grpc.StatusCode.UNAVAILABLE)
    assert not breakers.available_for("digits") and breakers.available_for("tabular")
    assert breakers.state("digits") == "open" and breakers["digits"].name == "inference-a/digits"
    assert breakers.available_for("never-called") and breakers.available
    breakers.settings = Breaker(failures=9, open_seconds=5)
    assert breakers.available_for("digits"), "new settings reach every circuit"
