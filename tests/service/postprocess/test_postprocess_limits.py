"""The postprocess servicer on a real aio server: time limits, requests kept apart, and
flights (the default config's pipelines, and a rule overrunning in a flight).

Rules registered here exist only in this process, so the server runs in process too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
import numpy as np
import pytest

from services.postprocess.app import build_engine
from services.postprocess.engine import RuleEngine
from services.postprocess.rule_chain import build_chain
from services.postprocess.rules import RULES, RuleContext
from services.postprocess.servicer import PostprocessServicer
from strata.config import load_settings
from strata.config.base import stage_union
from strata.config.pipelines import Pipeline
from strata.config.postprocess import BUILTIN_RULES, PluginRule, PostprocessSettings, RuleSpec
from strata.config.server import ServerSettings
from strata.errors import InvalidArgument
from strata.proto.v1 import postprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.server import start_server
from strata.wire import codec
from strata.wire.codec import Arrays
from tests.support.flight_requests import alone, by_member, flight
from tests.support.results import raise_for_result
from tests.support.system import make_config

LIMIT = 0.2
# Every rule that did not run is named: test_nap overran (or was not asked for), and
# test_refuse runs only when asked for.
NOT_ASKED = {"skipped_rules": "test_nap,test_refuse"}
MARGIN = 0.15
LOGITS = np.array([[0.0, 3.0, 1.0]], np.float32)


class NapSpec(RuleSpec):
    kind: Literal["test_nap"]
    input: str


class RefuseSpec(RuleSpec):
    kind: Literal["test_refuse"]
    input: str


@dataclass
class Nap:
    """Test-only: sleeps well past any limit."""

    options: NapSpec

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        time.sleep(1.0)
        return tensors


@dataclass
class Refuse:
    """Test-only: refuses a batch with a negative logit in its first column."""

    options: RefuseSpec

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        if (tensors[self.options.input][:, 0] < 0).any():
            raise InvalidArgument("a negative first logit")
        return tensors


@pytest.fixture(autouse=True)
def _test_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(RULES.classes, "test_nap", Nap)
    monkeypatch.setitem(RULES.classes, "test_refuse", Refuse)


# The built-in kinds and this module's test-only ones.
TestRule = stage_union((*BUILTIN_RULES, NapSpec, RefuseSpec), PluginRule)


class WithTestRules(Pipeline):
    """A pipeline whose rules may also be this module's test-only ones."""

    postprocess: list[TestRule] = []


PIPELINE = WithTestRules.model_validate(
    {
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
        "outputs": [
            {"name": "label", "datatype": "BYTES", "shape": [-1, 1]},
            {"name": "score", "datatype": "FP32", "shape": [-1, 1]},
        ],
        "model": {"name": "m"},
        "postprocess": [
            {"kind": "softmax", "input": "logits", "output": "probabilities"},
            {"kind": "test_nap", "input": "logits", "when": {"parameter": "slow"}},
            {"kind": "test_refuse", "input": "logits", "when": {"parameter": "strict"}},
            {
                "kind": "topk",
                "input": "probabilities",
                "k": 1,
                "values": "score",
                "indices": "classes",
            },
            {
                "kind": "labels",
                "input": "classes",
                "output": "label",
                "labels": ["a", "b", "c"],
                "core": False,
            },
        ],
    }
)


def new_engine() -> RuleEngine:
    settings = PostprocessSettings(rule_timeout_seconds=LIMIT)
    return RuleEngine({"p": build_chain("p", PIPELINE, Path("."), settings)}, settings)


@asynccontextmanager
async def postprocess(
    engine: RuleEngine | None = None,
) -> AsyncIterator[postprocess_pb2_grpc.PostprocessStub]:
    engine = engine or new_engine()
    registration = (
        PostprocessServicer(engine),
        postprocess_pb2_grpc.add_PostprocessServicer_to_server,
        "strata.v1.Postprocess",
    )
    running = await start_server([registration], "127.0.0.1:0", ServerSettings())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield postprocess_pb2_grpc.PostprocessStub(channel)
    finally:
        await channel.close()
        await running.server.stop(0)
        await engine.close()


def item(rid: str, pipeline: str = "p", **parameters: str) -> v1.Request:
    tensors = codec.arrays_to_tensors({"logits": LOGITS})
    return v1.Request(id=rid, pipeline=pipeline, tensors=tensors, parameters=parameters)


@pytest.mark.timing
def test_one_call_mixing_slow_fast_and_bad_requests() -> None:
    broken = v1.Request(id="broken", pipeline="p")
    broken.tensors.add(name="logits", datatype="FP32", shape=[1, 3], data=b"\x00")

    async def go():
        async with postprocess() as stub:
            started = time.monotonic()
            requests = [item("slow", slow="1"), item("fast"), item("lost", "nope"), broken]
            reply = await stub.Process(v1.ProcessRequest(requests=requests))
            return reply, time.monotonic() - started

    reply, elapsed = asyncio.run(go())
    assert elapsed < LIMIT + MARGIN
    slow, fast, lost, bad = reply.results
    assert [r.id for r in reply.results] == ["slow", "fast", "lost", "broken"]
    assert dict(slow.info) == {"skipped_rules": "test_nap,test_refuse"}
    assert raise_for_result(slow)["label"].tolist() == [[b"b"]]
    assert dict(fast.info) == NOT_ASKED and raise_for_result(fast)["label"].tolist() == [[b"b"]]
    assert lost.error.code == grpc.StatusCode.NOT_FOUND.value[0]
    assert bad.error.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "'logits'" in bad.error.message


@pytest.mark.timing
def test_sleeping_rules_do_not_hold_up_other_calls() -> None:
    async def timed(stub, request: v1.Request) -> tuple[float, v1.Result]:
        started = time.monotonic()
        reply = await stub.Process(v1.ProcessRequest(requests=[request]))
        return time.monotonic() - started, reply.results[0]

    async def go():
        async with postprocess() as stub:
            await timed(stub, item("warm"))
            # Two of the four workers asleep; the other two serve everyone else.
            slow = [asyncio.create_task(timed(stub, item(f"s{i}", slow="1"))) for i in range(2)]
            await asyncio.sleep(0.03)
            fast = [await timed(stub, item(f"f{i}")) for i in range(10)]
            return await asyncio.gather(*slow), fast

    slow, fast = asyncio.run(go())
    assert all(dict(r.info) == NOT_ASKED for _, r in slow)
    assert max(seconds for seconds, _ in slow) < LIMIT + MARGIN
    assert all(not r.HasField("error") and dict(r.info) == NOT_ASKED for _, r in fast)
    assert max(seconds for seconds, _ in fast) < LIMIT  # never waited for a limit


@pytest.mark.parametrize(
    ("flag", "outputs", "skipped"),
    [
        ("true", {"score"}, "test_nap,test_refuse,labels"),
        ("false", {"label", "score"}, "test_nap,test_refuse"),
    ],
)
def test_core_only_over_the_wire(flag: str, outputs: set, skipped: str) -> None:
    async def go():
        async with postprocess() as stub:
            return await stub.Process(v1.ProcessRequest(requests=[item("r", core_only=flag)]))

    result = asyncio.run(go()).results[0]
    assert set(raise_for_result(result)) == outputs
    assert dict(result.info) == {"skipped_rules": skipped}


# Flights


def calls(engine: RuleEngine, *requests: v1.Request) -> list[tuple[v1.Result, float]]:
    """Each request in a call of its own, in turn: its result, and how long the call took."""

    async def go():
        async with postprocess(engine) as stub:
            out = []
            for request in requests:
                started = time.monotonic()
                reply = await stub.Process(v1.ProcessRequest(requests=[request]))
                out.append((reply.results[0], time.monotonic() - started))
            return out

    return asyncio.run(go())


def logits(*first: float) -> dict[str, dict[str, np.ndarray]]:
    """One member per value: LOGITS with that first logit."""
    return {
        f"m{i}": {"logits": np.array([[value, 3.0, 1.0]], np.float32)}
        for i, value in enumerate(first)
    }


@pytest.mark.timing
def test_a_rule_overrunning_in_a_flight_is_skipped_once_for_the_flight() -> None:
    engine = new_engine()
    _, (result, elapsed) = calls(engine, item("warm"), flight("p", logits(0, 0, 0), slow="1"))
    assert elapsed < LIMIT + MARGIN
    assert dict(result.info) == NOT_ASKED
    assert all(out["label"].tolist() == [[b"b"]] for out in by_member(result).values())
    assert engine.metrics.overruns() == {("p", "test_nap"): 1}
    assert engine.metrics.snapshot()[("p", "softmax")].count == 2  # the warm-up, the flight


def test_a_member_a_rule_refuses_fails_alone() -> None:
    ((result, _),) = calls(new_engine(), flight("p", logits(0, -1, 0.5), strict="1"))
    answers = by_member(result)
    assert answers["m1"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert str(answers["m1"]) == "a negative first logit"
    assert answers["m0"]["label"].tolist() == answers["m2"]["label"].tolist() == [[b"b"]]
    assert [m.rows for m in result.members] == [1, 0, 1]


@pytest.mark.parametrize(("pipeline", "classes"), [("digits", 10), ("tabular", 2)])
def test_a_default_pipeline_flight_runs_each_rule_once_and_matches_separate_requests(
    tmp_path: Path, pipeline: str, classes: int
) -> None:
    engine = build_engine(load_settings(make_config(tmp_path)))
    rng = np.random.default_rng(classes)
    group = {
        f"m{i}": {"logits": rng.normal(size=(n, classes)).astype(np.float32)}
        for i, n in enumerate([2, 1, 3])
    }
    (flown, _), *separate = calls(engine, flight(pipeline, group), *alone(pipeline, group))
    rules = {rule: s.count for (name, rule), s in engine.metrics.snapshot().items()}
    assert rules == {"softmax": 4, "topk": 4, "labels": 4}  # once for the flight, 3 alone
    answers = by_member(flown)
    for result, _ in separate:
        expected = raise_for_result(result)
        assert answers[result.id].keys() == expected.keys()
        for name, array in expected.items():
            np.testing.assert_array_equal(answers[result.id][name], array)
