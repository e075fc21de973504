"""Control pieces alone: the control token check, per-peer limits, weight validation,
per-model circuits, and the gateway's v2 statistics."""

import math

import grpc
import numpy as np
import pytest

from services.gateway.door.limiter import RateLimiter
from services.gateway.flow.statistics import Hops, Statistics
from services.gateway.runtime import _needs_restart
from services.gateway.upstream.breaker import Breakers
from services.gateway.upstream.router import Router
from strata import codec
from strata.config import load_settings
from strata.config.gateway import Breaker, RateLimits, TokenBucket
from strata.config.pipelines import Route
from strata.errors import InvalidArgument, Unauthenticated
from strata.proto.inference import grpc_service_pb2 as v2
from strata.tokens import ControlAuth, ControlOff
from tests.support.system import DEFAULT_CONFIG


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


def test_rotating_client_ids_does_not_escape_the_peer_bucket() -> None:
    now = [0.0]
    limits = RateLimits(per_client=TokenBucket(rate=1, burst=1), peer_clients=3)
    limiter = RateLimiter(limits, lambda: now[0])
    admitted = [limiter.admit(f"id:{i}", "peer:ipv4:10.0.0.1") for i in range(4)]
    assert [a[0] for a in admitted] == [True, True, True, False]
    assert admitted[3][2] == "peer" and admitted[3][1] == pytest.approx(1 / 3)
    assert limiter.admit("id:other", "peer:ipv4:10.0.0.2")[0], "another peer has its own"
    assert all(limiter.admit(f"key:{i}")[0] for i in range(10)), "a registered key: no peer limit"
    now[0] += 1 / 3
    assert limiter.admit("id:9", "peer:ipv4:10.0.0.1")[0]


def test_no_per_client_limit_means_no_peer_limit_either() -> None:
    limiter = RateLimiter(RateLimits(peer_clients=1))
    assert all(limiter.admit(f"id:{i}", "peer:ipv4:10.0.0.1")[0] for i in range(100))


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
    routes = [Route(arm="a", deployment="a", weight=9), Route(arm="b", deployment="b", weight=1)]
    router = Router("p", routes, None)
    with pytest.raises(InvalidArgument, match=says):
        router.set_weights(weights)
    assert [r.weight for r in router.routes] == [9, 1]


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


def test_an_arm_whose_model_circuit_is_open_is_routed_around() -> None:
    routes = [Route(arm="a", deployment="a", weight=9), Route(arm="b", deployment="b", weight=1)]
    router = Router("p", routes, None, available=lambda route: route.deployment != "a")
    assert {router.choose(f"client-{i}").arm for i in range(40)} == {"b"}
    assert router.fallback("client-0", routes[1], lambda route: True) is None


def answer(rows: int, **parameters: bool | str) -> v2.ModelInferResponse:
    response = v2.ModelInferResponse(model_name="p")
    codec.add_outputs(response, {"y": np.zeros((rows, 2), np.float32)})
    for key, value in parameters.items():
        field = "bool_param" if isinstance(value, bool) else "string_param"
        setattr(response.parameters[key], field, value)
    return response


def test_statistics_add_up_in_v2_terms() -> None:
    stats = Statistics()
    stats.flew("p", 2, Hops(preprocess=0.001, inference=0.002, postprocess=0.003))
    stats.finished("p", 0.010, answer(3))
    stats.finished("p", 0.012, answer(1))
    stats.finished("p", 0.001, answer(1, **{"strata.cached": True}))
    stats.finished("p", 0.002, answer(1, **{"strata.degraded_source": "default"}))
    stats.finished("p", 0.004, None)
    message = stats.model_statistics("p", "1")
    infer = message.inference_stats
    fields = ("success", "fail", "cache_hit", "queue", "compute_input", "compute_infer")
    ms = {
        name: (getattr(infer, name).count, round(getattr(infer, name).ns / 1e6, 3))
        for name in (*fields, "compute_output")
    }
    assert (message.name, message.version) == ("p", "1")
    assert (message.inference_count, message.execution_count) == (6, 1)
    assert ms == {
        "success": (4, 25),
        "fail": (1, 4),
        "cache_hit": (1, 1),
        "queue": (2, 10),  # the chain's two answers took 22 ms, 12 ms of it in the hops
        "compute_input": (2, 2),
        "compute_infer": (2, 4),
        "compute_output": (2, 6),
    }
    assert message.last_inference > 0
    assert stats.model_statistics("never", "1").inference_stats.success.count == 0


def test_statistics_per_model_version_add_up_to_the_pipeline() -> None:
    stats = Statistics()
    hops = Hops(preprocess=0.001, inference=0.002, postprocess=0.003)
    stats.flew("p", 2, hops, "1")
    stats.flew("p", 1, hops, "2")
    for version, rows in (("1", 3), ("1", 1), ("2", 5)):
        response = answer(rows)
        response.model_version = version
        stats.finished("p", 0.010, response)
    stats.finished("p", 0.004, None)  # failed: no version answered
    whole = stats.model_statistics("p", "1")
    one, two = (stats.model_statistics("p", v, model_version=v) for v in ("1", "2"))
    assert stats.versions("p") == ["1", "2"]
    assert (one.version, one.inference_count, one.execution_count) == ("1", 4, 1)
    assert (two.version, two.inference_count, two.execution_count) == ("2", 5, 1)
    assert (whole.inference_count, whole.execution_count) == (9, 2)
    counts = [m.inference_stats.success.count for m in (one, two, whole)]
    assert counts == [2, 1, 3]
    assert [m.inference_stats.fail.count for m in (one, two, whole)] == [0, 0, 1]
    assert one.inference_stats.compute_infer.count == 2
    assert stats.model_statistics("p", "3", model_version="3").inference_count == 0


def test_of_telemetry_only_the_sample_ratio_reloads_live() -> None:
    old = load_settings(DEFAULT_CONFIG)

    def with_telemetry(**changes: object):
        return old.model_copy(update={"telemetry": old.telemetry.model_copy(update=changes)})

    assert _needs_restart(old, with_telemetry(sample_ratio=0.25)) == []
    assert _needs_restart(old, with_telemetry(otlp_endpoint="http://127.0.0.1:4317")) == [
        "telemetry"
    ]
