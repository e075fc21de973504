"""One way to call a model for a flight (services/gateway/flow/model_calls.py): what a call
sends and counts, whose fault a refusal is, and where the members a model could not answer
go next."""

from __future__ import annotations

import asyncio
import functools

import numpy as np
import pytest
from prometheus_client import REGISTRY

from services.gateway.flow import blame
from services.gateway.flow.model_calls import Model, ModelCalls, model_request
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from strata.config.pipelines import Pipeline, Route
from strata.errors import (
    DeadlineExceeded,
    InvalidArgument,
    MalformedReply,
    Miswired,
    StrataError,
    Unavailable,
)
from strata.wire import codec, flight
from tests.unit.gateway.flow.parts import Deployments, Server, member, pipeline, routes, rows_of

A, B = routes("a", "b")


def first_model(
    spec: Pipeline, has_fallback: bool = False, arms: list[Route] | None = None
) -> Model:
    router = Router("p", arms or [A, B], None)
    return Model(
        "p", spec.model, router, functools.partial(blame.first_model, "p", spec), has_fallback
    )


def later_stage(has_fallback: bool = False) -> Model:
    spec = pipeline()
    router = Router("p/large", [A, B], None)
    blamed = functools.partial(blame.later_stage, "p", "large")
    return Model("p/large", spec.model, router, blamed, has_fallback)


def calls_over(usable: set[str] | None = None, **servers: Server) -> tuple[ModelCalls, ArmBook]:
    arms = ArmBook()
    deployments = Deployments(**servers)
    return ModelCalls(deployments, arms, lambda r: usable is None or r.arm in usable), arms


def failovers(pipeline_name: str, to_arm: str) -> float:
    labels = {"pipeline": pipeline_name, "from_arm": "a", "to_arm": to_arm}
    return REGISTRY.get_sample_value("strata_gateway_failovers_total", labels) or 0.0


def test_a_call_carries_each_members_rows_and_counts_them_on_its_arm() -> None:
    async def scenario() -> None:
        server = Server()
        calls, arms = calls_over(**{"d-a": server})
        members = [member("r1", 1), member("r2", 2)]
        x = rows_of(3)
        features = [codec.to_tensor("x", x)]
        reply = await calls.call(first_model(pipeline()), A, members, [1, 2], features, spare=True)
        (sent,) = server.requests
        assert flight.members(sent.parameters, 3)[1].rows == 2
        assert server.spares == [True]
        np.testing.assert_array_equal(codec.tensors_to_arrays(reply.outputs)["y"], x * 2)
        assert reply.version == "7" and reply.errors == {}
        figures = arms.get("p", "a")
        assert figures.requests == 2 and figures.errors == 0 and len(figures.latencies) == 2

    asyncio.run(scenario())


def test_a_refusal_of_tensors_the_server_made_is_never_the_clients() -> None:
    """Preprocess made the first model's inputs: its INVALID_ARGUMENT is a miswired pipeline
    (FAILED_PRECONDITION); without preprocess the client made them, and it stays theirs."""

    async def refused(spec: Pipeline) -> StrataError:
        server = Server(error=InvalidArgument("input 'x': wrong shape"))
        calls, arms = calls_over(**{"d-a": server})
        features = [codec.to_tensor("x", rows_of(1))]
        with pytest.raises(StrataError) as caught:
            await calls.call(
                first_model(spec), A, [member("r", 1, spec)], [1], features, spare=False
            )
        assert arms.get("p", "a").errors == 1
        return caught.value

    steps = [{"kind": "cast", "input": "x", "datatype": "FP32"}]
    made_by_preprocess = asyncio.run(refused(pipeline(preprocess=steps)))
    assert isinstance(made_by_preprocess, Miswired)
    assert made_by_preprocess.code.name == "FAILED_PRECONDITION"
    assert "preprocess steps 'cast'" in str(made_by_preprocess)
    assert isinstance(asyncio.run(refused(pipeline())), InvalidArgument)


def test_each_members_own_refusal_by_a_later_stage_is_blamed_on_the_server() -> None:
    async def scenario() -> None:
        server = Server(failing={1: InvalidArgument("bad rows")})
        calls, _ = calls_over(**{"d-a": server})
        members = [member("r1", 1), member("r2", 1), member("r3", 1)]
        x = rows_of(3)
        features = [codec.to_tensor("x", x)]
        reply = await calls.call(later_stage(), A, members, [1, 1, 1], features, spare=False)
        assert list(reply.errors) == [1] and isinstance(reply.errors[1], Miswired)
        assert "stage 'large' refused" in str(reply.errors[1])
        np.testing.assert_array_equal(codec.tensors_to_arrays(reply.outputs)["y"], x[[0, 2]] * 2)

    asyncio.run(scenario())


def test_a_malformed_reply_is_the_servers_fault_and_counts_against_the_arm() -> None:
    async def scenario() -> None:
        calls, arms = calls_over(**{"d-a": Server(malformed=True)})
        features = [codec.to_tensor("x", rows_of(1))]
        with pytest.raises(MalformedReply, match="inference deployment 'd-a'"):
            await calls.call(later_stage(), A, [member("r", 1)], [1], features, spare=False)
        assert arms.get("p/large", "a").errors == 1

    asyncio.run(scenario())


def test_a_model_learns_its_usual_seconds_from_its_calls() -> None:
    async def scenario() -> None:
        calls, _ = calls_over(**{"d-a": Server(delay=0.05)})
        assert calls.usual("p/large") == 0.0
        features = [codec.to_tensor("x", rows_of(1))]
        await calls.call(later_stage(), A, [member("r", 1)], [1], features, spare=False)
        assert calls.usual("p/large") >= 0.04  # slept 0.05 s
        assert calls.usual("p") == 0.0, "each model's own"

    asyncio.run(scenario())


def test_members_on_an_unavailable_arm_move_to_another_usable_one_once() -> None:
    async def scenario() -> None:
        calls, _ = calls_over()
        members = [member("r1", 1), member("r2", 1)]
        error = Unavailable("arm a is down")
        before = failovers("p", "b")
        after = calls.after(first_model(pipeline()), members, {0: error, 1: error}, A)
        assert list(after.moved) == ["b"] and after.moved["b"] == (B, [0, 1])
        assert after.fallback == [] and all(m.waiting for m in members)
        assert failovers("p", "b") == before + 2
        again = calls.after(first_model(pipeline()), members, {0: error, 1: error}, None)
        assert again.moved == {} and not any(m.waiting for m in members), "no second move"
        assert isinstance(members[0].future.exception(), Unavailable)

    asyncio.run(scenario())


def test_without_another_usable_arm_the_fallback_answers_for_the_servers_failures() -> None:
    async def scenario() -> None:
        calls, _ = calls_over(usable={"a"})
        members = [member(f"r{i}", 1) for i in range(4)]
        errors: dict[int, StrataError] = {
            0: Unavailable("down"),
            1: InvalidArgument("bad input"),
            2: DeadlineExceeded("too late"),
            3: Miswired("pipeline does not fit"),
        }
        after = calls.after(later_stage(has_fallback=True), members, errors, A)
        assert after.moved == {} and after.fallback == [0, 3]
        assert [m.waiting for m in members] == [True, False, False, True]
        assert isinstance(members[1].future.exception(), InvalidArgument)
        assert isinstance(members[2].future.exception(), DeadlineExceeded)

    asyncio.run(scenario())


def test_a_model_without_a_fallback_fails_its_members_with_their_own_errors() -> None:
    async def scenario() -> None:
        calls, _ = calls_over(usable=set())
        members = [member("r1", 1), member("r2", 1)]
        errors: dict[int, StrataError] = {0: Unavailable("down"), 1: MalformedReply("d", "bad")}
        after = calls.after(first_model(pipeline()), members, errors, A)
        assert after.moved == {} and after.fallback == []
        assert [type(m.future.exception()) for m in members] == [Unavailable, MalformedReply]

    asyncio.run(scenario())


def test_spare_says_whether_another_arm_could_take_the_call() -> None:
    calls, _ = calls_over(usable={"a", "b"})
    assert calls.spare(first_model(pipeline()), "client", A)
    assert not calls.spare(first_model(pipeline(), arms=[A]), "client", A)
    only_a, _ = calls_over(usable={"a"})
    assert not only_a.spare(first_model(pipeline()), "client", A)


def test_a_request_of_one_member_is_a_plain_batch_and_of_several_a_flight() -> None:
    async def scenario() -> None:
        x = [codec.to_tensor("x", rows_of(3))]
        one = model_request("small", "2", [member("r", 3)], [3], x)
        assert one.model_version == "2" and one.id == "r"
        assert not flight.is_flight(one.parameters)
        assert "skip_batching" not in one.parameters
        several = model_request("small", "", [member("r1", 1), member("r2", 2)], [1, 2], x)
        assert [m.rows for m in flight.members(several.parameters, 3)] == [1, 2]
        shed = model_request("small", "", [member("r", 3, level=2)], [3], x)
        assert shed.parameters["skip_batching"].bool_param
        np.testing.assert_array_equal(codec.request_inputs(several)["x"], rows_of(3))

    asyncio.run(scenario())
