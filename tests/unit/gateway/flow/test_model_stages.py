"""A pipeline's later stages over a flight (services/gateway/flow/model_stages.py): the rows a
conditional stage takes and writes, its fallback, its other arm, a member refused alone, a
budget shorter than a stage's usual time, and the first model's fallback run as a stage."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
from prometheus_client import REGISTRY

from services.gateway.flow.fallback import FALLBACK
from services.gateway.flow.flights import Member
from services.gateway.flow.model_calls import ModelCalls
from services.gateway.flow.model_stages import EARLY_EXIT, Staged, Stages, later_models
from services.gateway.flow.shadow import ShadowRunner
from services.gateway.upstream.arms import ArmBook
from services.gateway.upstream.router import Router
from strata.config.pipelines import Pipeline, Route
from strata.errors import DeadlineExceeded, InvalidArgument, Miswired, Unavailable
from strata.wire import codec
from tests.unit.gateway.flow.parts import Deployments, Server, member, pipeline, rows_of


def tenfold(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The stage's model: `y` is ten times `x`."""
    return {"y": inputs["x"] * 10}


def negated(inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A fallback model: `y` is minus `x`."""
    return {"y": -inputs["x"]}


def model(name: str, *arms: str) -> dict[str, Any]:
    """Model `name` with an arm on deployment `d-<name>-<arm>` for each of `arms`."""
    return {
        "name": name,
        "routes": [{"arm": arm, "deployment": f"d-{name}-{arm}"} for arm in arms],
    }


def cascade(when: dict[str, Any] | None = None, **stage: Any) -> Pipeline:
    """small (x -> y), then stage `large` (x -> y) for the rows `when` picks."""
    return pipeline(
        stages=[{"model": model("large", "a"), "inputs": {"x": "x"}, "when": when, **stage}]
    )


def routers(spec: Pipeline) -> dict[tuple[str, str], Router]:
    """Each later model's router, as stage_routers makes them from the settings."""
    return {
        ("p", label): Router(f"p/{label}", [Route(**r) for r in later.model_dump()["routes"]], None)
        for label, later in later_models(spec)
    }


def stages_over(spec: Pipeline, **servers: Server) -> tuple[Stages, ArmBook]:
    deployments = Deployments(**servers)
    arms = ArmBook()
    calls = ModelCalls(deployments, arms, lambda route: True)
    return Stages(routers(spec), calls, ShadowRunner(deployments)), arms


async def run(stages: Stages, members: list[Member], x: np.ndarray) -> Staged:
    """The stages after the first model (`small`, doubling) answered `x`."""
    features = [codec.to_tensor("x", x)]
    return await stages.run(members, features, [codec.to_tensor("y", x * 2)], "small")


def given(staged: Staged) -> dict[str, np.ndarray]:
    return codec.tensors_to_arrays(staged.given)


def test_a_conditional_stage_runs_for_the_rows_it_picks_and_the_rest_keep_their_answer() -> None:
    async def scenario() -> None:
        spec = cascade({"tensor": "y", "measure": "max", "above": 5})
        large = Server(model=tenfold)
        stages, arms = stages_over(spec, **{"d-large-a": large})
        sure, unsure = member("sure", 1, spec), member("unsure", 2, spec)
        x = rows_of(3)  # y = 2x: row 0's max is 2, rows 1 and 2 pass 5
        staged = await run(stages, [sure, unsure], x)
        (sent,) = large.requests
        np.testing.assert_array_equal(codec.request_inputs(sent)["x"], x[1:])
        np.testing.assert_array_equal(given(staged)["y"], np.concatenate([x[:1] * 2, x[1:] * 10]))
        assert staged.answered == {sure: ["small"], unsure: ["small", "large"]}
        assert staged.degraded == {}
        assert arms.get("p/large", "a").requests == 1

    asyncio.run(scenario())


def test_a_stage_whose_arm_is_unavailable_is_answered_by_its_fallback_marked_degraded() -> None:
    async def scenario() -> None:
        spec = cascade(fallback={"model": model("lite", "a")})
        down = Server(error=Unavailable("inference-d-large-a: connection refused"))
        stages, arms = stages_over(spec, **{"d-large-a": down, "d-lite-a": Server(model=negated)})
        members = [member("r1", 1, spec), member("r2", 1, spec)]
        staged = await run(stages, members, rows_of(2))
        np.testing.assert_array_equal(given(staged)["y"], -rows_of(2))
        assert all(staged.answered[m] == ["small", "large/fallback"] for m in members)
        assert staged.degraded == {m: FALLBACK for m in members}
        assert arms.get("p/large", "a").errors == 2
        assert arms.get("p/large/fallback", "a").requests == 2

    asyncio.run(scenario())


def test_a_stage_whose_arm_is_unavailable_moves_to_its_other_arm_first() -> None:
    async def scenario() -> None:
        spec = pipeline(
            stages=[
                {
                    "model": model("large", "a", "b"),
                    "inputs": {"x": "x"},
                    "fallback": {"model": model("lite", "a")},
                }
            ]
        )
        down = Server(error=Unavailable("inference-d-large-a: connection refused"))
        servers = {
            "d-large-a": down,
            "d-large-b": Server(model=tenfold),
            "d-lite-a": Server(model=negated),
        }
        stages, _ = stages_over(spec, **servers)
        labels = {"pipeline": "p/large", "from_arm": "a", "to_arm": "b"}
        before = REGISTRY.get_sample_value("strata_gateway_failovers_total", labels) or 0.0
        # Each client's sticky arm: some start on a, and all end on b.
        members = [member(f"r{i}", 1, spec) for i in range(8)]
        staged = await run(stages, members, rows_of(8))
        np.testing.assert_array_equal(given(staged)["y"], rows_of(8) * 10)
        assert staged.degraded == {}
        assert down.requests, "some client's sticky arm was a"
        after = REGISTRY.get_sample_value("strata_gateway_failovers_total", labels)
        assert after is not None and after > before
        assert servers["d-lite-a"].requests == []

    asyncio.run(scenario())


def test_a_member_the_stage_refuses_fails_alone_as_the_servers_mistake() -> None:
    async def scenario() -> None:
        spec = cascade()
        large = Server(model=tenfold, failing={0: InvalidArgument("input 'x': bad values")})
        stages, _ = stages_over(spec, **{"d-large-a": large})
        refused, kept = member("refused", 1, spec), member("kept", 2, spec)
        staged = await run(stages, [refused, kept], rows_of(3))
        assert isinstance(refused.future.exception(), Miswired)
        assert staged.members == [kept]
        np.testing.assert_array_equal(given(staged)["y"], rows_of(3)[1:] * 10)

    asyncio.run(scenario())


def test_a_member_whose_budget_is_shorter_than_the_stages_usual_time_leaves_early() -> None:
    """Behind a condition it leaves with the first model's answer, marked early_exit; a stage
    every row needs fails it instead."""

    async def scenario(when: dict[str, Any] | None) -> Member:
        spec = cascade(when)
        large = Server(model=tenfold, delay=0.05)
        stages, _ = stages_over(spec, **{"d-large-a": large})
        await run(stages, [member("teacher", 1, spec)], rows_of(1, start=10))  # learns 50+ ms
        hurried = member("hurried", 1, spec, seconds=0.01)
        staged = await run(stages, [hurried], rows_of(1, start=10))
        assert len(large.requests) == 1, "no call for a member that cannot wait for it"
        if staged.members:
            assert staged.degraded == {hurried: EARLY_EXIT}
            assert staged.answered[hurried] == ["small"]
            np.testing.assert_array_equal(given(staged)["y"], rows_of(1, start=10) * 2)
        return hurried

    conditional = asyncio.run(scenario({"tensor": "y", "measure": "max", "above": 5}))
    assert conditional.waiting
    needed = asyncio.run(scenario(None))
    assert isinstance(needed.future.exception(), DeadlineExceeded)
    assert "usually takes" in str(needed.future.exception())


def test_the_first_models_fallback_stands_in_as_a_stage_then_the_later_stages_run() -> None:
    async def scenario() -> None:
        spec = pipeline(
            fallback={"model": model("tiny", "a")},
            stages=[{"model": model("large", "a"), "inputs": {"y": "y"}}],
        )
        tiny, large = Server(model=negated), Server(model=lambda i: {"z": i["y"] + 1})
        stages, _ = stages_over(spec, **{"d-tiny-a": tiny, "d-large-a": large})
        members = [member("r1", 1, spec), member("r2", 1, spec)]
        staged = await stages.stand_in(members, [codec.to_tensor("x", rows_of(2))])
        assert [t.name for t in staged.given] == ["y", "z"]
        np.testing.assert_array_equal(given(staged)["z"], -rows_of(2) + 1)
        assert all(staged.answered[m] == ["small/fallback", "large"] for m in members)
        assert staged.degraded == {m: FALLBACK for m in members}

    asyncio.run(scenario())


def test_later_models_are_labelled_as_strata_stages_names_them() -> None:
    spec = pipeline(
        fallback={"model": {"name": "tiny"}},
        stages=[
            {
                "model": {"name": "large"},
                "inputs": {"x": "x"},
                "fallback": {"model": {"name": "lite"}},
            }
        ],
    )
    labelled = [(label, ref.name) for label, ref in later_models(spec)]
    assert labelled == [("small/fallback", "tiny"), ("large", "large"), ("large/fallback", "lite")]
