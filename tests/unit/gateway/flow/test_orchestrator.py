"""One client request at the gateway (services/gateway/flow/orchestrator.py): the answers it
gets without the chain, what it must share to travel with others, and how its failures count
for the ladder. The orchestrator is the gateway's own, built from the default config by its
composition root (app.compose); nothing behind it runs, so an answer that needed the chain
could not come."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from services.gateway.app import compose
from services.gateway.flow import orchestrator
from services.gateway.flow.orchestrator import default_outputs
from services.gateway.request import Answer, ClientRequest
from services.gateway.runtime import Runtime
from strata.config import Settings, load_settings
from strata.config.pipelines import Pipeline
from strata.errors import DeadlineExceeded, InvalidArgument, Overloaded, StrataError, Unavailable
from strata.wire import codec
from strata.wire.deadline import Deadline
from tests.support.system import DEFAULT_CONFIG

DEFAULT = {"labels": ["zero", "one", "two"], "scores": [0.5, 0.3, 0.2]}


def settings(**changes: Any) -> Settings:
    """The default config with its `digits` pipeline changed by `changes`."""
    loaded = load_settings(DEFAULT_CONFIG)
    digits = loaded.pipelines["digits"].model_copy(update=changes)
    return loaded.model_copy(update={"pipelines": {"digits": digits}})


def request(
    pipeline: Pipeline, images: int, client: str = "client", **fields: Any
) -> ClientRequest:
    sent = {"images": np.zeros((images, 8, 8), np.uint8)}
    arrays, raw = codec.client_inputs(codec.build_request("digits", sent))
    return ClientRequest(
        "digits", pipeline, arrays, raw, "r1", client, "", Deadline.after(2.0), **fields
    )


def at_level(level: int, loaded: Settings, ask: Callable[[Runtime], Awaitable[Answer]]) -> Answer:
    """`ask`'s answer from the gateway's orchestrator, its ladder pinned at `level`."""

    async def scenario() -> Answer:
        runtime = compose(loaded)
        runtime.ladder.force(level)
        try:
            return await ask(runtime)
        finally:
            await runtime.close()

    return asyncio.run(scenario())


def test_at_level_three_the_default_answer_comes_for_each_row_without_the_chain() -> None:
    loaded = settings(default_answer=DEFAULT)
    pipeline = loaded.pipelines["digits"]
    answer = at_level(3, loaded, lambda runtime: runtime.orchestrator.infer(request(pipeline, 2)))
    assert answer.degraded == "default" and answer.level == 3 and answer.model_version == ""
    assert answer.outputs["labels"].tolist() == [[b"zero", b"one", b"two"]] * 2
    np.testing.assert_array_equal(answer.outputs["scores"], np.float32([[0.5, 0.3, 0.2]] * 2))
    assert answer.arm in {"control", "canary"}


def test_a_request_over_the_pipelines_batch_is_refused_before_any_work() -> None:
    loaded = settings(default_answer=DEFAULT)
    pipeline = loaded.pipelines["digits"]
    with pytest.raises(InvalidArgument, match="64"):
        at_level(3, loaded, lambda runtime: runtime.orchestrator.infer(request(pipeline, 65)))


def test_requests_travel_together_only_where_they_share_arm_shapes_level_and_parameters() -> None:
    pipeline = settings().pipelines["digits"]
    control, canary = pipeline.model.routes

    def key(req: ClientRequest, route: Any = control) -> tuple[Any, ...]:
        return orchestrator._flight_key(req, route)

    first, second = request(pipeline, 1, "c1"), request(pipeline, 3, "c2")
    assert key(first) == key(second), "other clients and row counts share a flight"
    assert key(first) != key(second, canary)
    assert key(first) != key(request(pipeline, 1, level=2))
    assert key(first) != key(request(pipeline, 1, parameters={"top": "1"}))
    unbatched = pipeline.model_copy(update={"max_batch_size": 0})
    assert key(request(unbatched, 1)) != key(request(unbatched, 1)), "each one alone"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (Unavailable("down"), "error"),
        (StrataError("unknown"), "error"),
        (Overloaded("queue full"), "rejected"),
        (InvalidArgument("bad input"), ""),
        (DeadlineExceeded("too late"), ""),
    ],
)
def test_how_a_failure_counts_for_the_ladder(error: StrataError, kind: str) -> None:
    assert orchestrator._outcome_kind(error) == kind


def test_a_default_answer_of_strings_is_bytes_as_the_answer_carries_them() -> None:
    pipeline = settings().pipelines["digits"]
    outputs = default_outputs(pipeline.outputs, DEFAULT, 3)
    assert outputs["labels"].dtype == object and outputs["labels"].shape == (3, 3)
    assert outputs["scores"].dtype == np.float32 and outputs["scores"].shape == (3, 3)
