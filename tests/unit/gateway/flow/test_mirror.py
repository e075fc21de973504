"""Copies for a shadow route (services/gateway/flow/mirror.py): each mirrored member's own rows
of what its model was sent and gave reach the shadow runner, which compares the mirror's
answer with them (services/gateway/flow/shadow.py)."""

from __future__ import annotations

import asyncio

import numpy as np

from services.gateway.flow.flights import Member
from services.gateway.flow.mirror import mirror_first, mirror_stage
from services.gateway.flow.shadow import ShadowRunner, ShadowStats
from services.gateway.upstream.router import Router
from strata.config.pipelines import Shadow, Stage
from strata.proto.inference import grpc_service_pb2 as v2
from strata.wire import codec
from tests.unit.gateway.flow.parts import Deployments, Server, member, pipeline, routes, rows_of

MIRROR = Shadow(deployment="d-mirror")


async def compared(runner: ShadowRunner, name: str, count: int) -> ShadowStats:
    """`name`'s figures once `count` copies came back (within 10 s)."""
    for _ in range(10_000):
        stats = runner.stats.get(name)
        if stats is not None and stats.compared + stats.errors >= count:
            return stats
        await asyncio.sleep(0.001)
    raise AssertionError(f"{name}: {count} copies did not come back")


def sent_x(server: Server) -> list[np.ndarray]:
    return [codec.request_inputs(request)["x"] for request in server.requests]


def test_the_first_models_copies_carry_each_members_own_rows() -> None:
    async def scenario() -> None:
        spec = pipeline(model={"name": "small", "shadow": MIRROR.model_dump()})
        mirror = Server()  # doubles, as the primary did
        runner = ShadowRunner(Deployments(**{"d-mirror": mirror}))
        members = [member("r1", 1, spec), member("r2", 2, spec)]
        x = rows_of(3)
        primary = x * 2
        primary[2] = primary[2, ::-1]  # r2's second row: another top class than the mirror's
        features, scores = [codec.to_tensor("x", x)], [codec.to_tensor("y", primary)]
        mirror_first(runner, Router("p", routes("a"), MIRROR), members, features, scores)
        stats = await compared(runner, "p", 2)
        assert (stats.compared, stats.agreed) == (2, 1)
        for got, want in zip(sent_x(mirror), [x[:1], x[1:]], strict=True):
            np.testing.assert_array_equal(got, want)

    asyncio.run(scenario())


def test_nothing_is_copied_where_the_model_has_no_shadow() -> None:
    async def scenario() -> None:
        runner = ShadowRunner(Deployments())
        members = [member("r1", 1)]
        tensors = [codec.to_tensor("x", rows_of(1))]
        mirror_first(runner, Router("p", routes("a"), None), members, tensors, tensors)
        assert runner.stats == {}

    asyncio.run(scenario())


def test_a_stages_copies_carry_the_rows_its_model_answered_for_each_member() -> None:
    """The call carried r1, r2 and r3 (1, 2 and 1 rows); the model refused r2, so its reply
    holds r1's row then r3's."""

    async def scenario() -> None:
        mirror = Server()
        runner = ShadowRunner(Deployments(**{"d-mirror": mirror}))
        stage = Stage(model={"name": "large", "shadow": MIRROR.model_dump()}, inputs={"x": "x"})
        members: list[Member] = [member("r1", 1), member("r2", 2), member("r3", 1)]
        x = rows_of(4)
        request = codec.build_request("large", {"x": x})
        reply = v2.ModelInferResponse()
        codec.add_outputs(reply, {"y": x[[0, 3]] * 2})
        router = Router("p/large", routes("a"), MIRROR)
        mirror_stage(runner, router, stage, members, [0, 2], [1, 2, 1], request, reply)
        stats = await compared(runner, "p/large", 2)
        assert (stats.compared, stats.agreed) == (2, 2)
        for got, want in zip(sent_x(mirror), [x[:1], x[3:]], strict=True):
            np.testing.assert_array_equal(got, want)

    asyncio.run(scenario())
