"""The rule engine: order, conditions, core-only, time limits, and requests kept apart."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from opentelemetry.sdk.trace import TracerProvider
from pydantic import ValidationError

from services.postprocess.engine import RuleEngine
from services.postprocess.rule_chain import build_chain
from services.postprocess.rules import RULES, RuleContext
from services.postprocess.rules.base import Misconfigured
from strata.config.base import stage_union
from strata.config.pipelines import Pipeline
from strata.config.postprocess import (
    BUILTIN_RULES,
    PluginRule,
    PostprocessSettings,
    RuleSpec,
    SoftmaxRule,
)
from strata.errors import InvalidArgument, NotFound, NotReady, Unavailable
from strata.wire.codec import Arrays

LIMIT = 0.2
MARGIN = 0.15
LOGITS = np.array([[0.0, 2.0, 1.0]], np.float32)


class SleepSpec(RuleSpec):
    kind: Literal["test_sleep"]
    input: str
    output: str
    seconds: float


class RecordSpec(RuleSpec):
    kind: Literal["test_record"]
    input: str


FINISHED = threading.Event()
CALLS: list = []


@dataclass
class Sleep:
    """Test-only: sleeps, then writes `output`; FINISHED says whether it finished."""

    options: SleepSpec

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        time.sleep(self.options.seconds)
        FINISHED.set()
        return {**tensors, self.options.output: np.ones(1, np.float32)}


@dataclass
class Record:
    """Test-only: notes in CALLS that it ran."""

    options: RecordSpec

    @property
    def inputs(self) -> tuple[str, ...]:
        return (self.options.input,)

    def apply(self, tensors: Arrays, context: RuleContext) -> Arrays:
        CALLS.append(time.monotonic())
        return tensors


# The built-in kinds and this module's test-only ones.
TestRule = stage_union((*BUILTIN_RULES, SleepSpec, RecordSpec), PluginRule)


class WithTestRules(Pipeline):
    """A pipeline whose rules may also be this module's test-only ones."""

    postprocess: list[TestRule] = []


SOFTMAX = {"kind": "softmax", "input": "logits", "output": "probabilities"}
TOPK = {"kind": "topk", "input": "probabilities", "k": 2, "values": "scores", "indices": "classes"}
LABELS = {"kind": "labels", "input": "classes", "output": "labels", "labels": ["a", "b", "c"]}
CLASSIFY = ("labels", "scores", "probabilities")
# What each output the tests declare is: the engine answers only what fits its declaration.
DECLARED = {
    "probabilities": ("FP32", [-1, 3]),
    "scores": ("FP32", [-1, 2]),
    "labels": ("BYTES", [-1, 2]),
    "slept": ("FP32", [-1]),
    "flagged": ("BOOL", [-1]),
    "text": ("BYTES", [-1]),
}


def engine_for(
    *rules: dict, outputs: tuple[str, ...] = CLASSIFY, workers: int = 4, **settings: Any
) -> RuleEngine:
    spec = WithTestRules.model_validate(
        {
            "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 3]}],
            "outputs": [
                {"name": n, "datatype": DECLARED[n][0], "shape": DECLARED[n][1]} for n in outputs
            ],
            "model": {"name": "m"},
            "postprocess": list(rules),
        }
    )
    config = PostprocessSettings(rule_timeout_seconds=LIMIT, workers=workers, **settings)
    return RuleEngine({"p": build_chain("p", spec, Path("."), config)}, config)


def sleep(seconds: float, **extra: Any) -> dict:
    return {"kind": "test_sleep", "input": "logits", "output": "slept", "seconds": seconds, **extra}


def run(engine: RuleEngine, parameters: dict | None = None, tensors: dict | None = None):
    async def go():
        return await engine.run("p", tensors or {"logits": LOGITS}, parameters or {})

    return asyncio.run(go())


@pytest.fixture(autouse=True)
def _reset(monkeypatch: pytest.MonkeyPatch) -> None:
    FINISHED.clear()
    CALLS.clear()
    monkeypatch.setitem(RULES.classes, "test_sleep", Sleep)
    monkeypatch.setitem(RULES.classes, "test_record", Record)


# order, outputs and errors


def test_rules_run_in_order_and_only_declared_outputs_return() -> None:
    outputs, info = run(engine_for(SOFTMAX, TOPK, LABELS))
    assert info == {}
    assert set(outputs) == {"labels", "scores", "probabilities"}  # classes is not declared
    assert outputs["labels"].tolist() == [[b"b", b"c"]]


def test_a_missing_input_with_nothing_skipped_is_the_servers_fault() -> None:
    with pytest.raises(NotReady, match="rule 'softmax' needs tensor 'logits', which neither"):
        run(engine_for(SOFTMAX), tensors={"wrong": LOGITS})
    with pytest.raises(NotFound, match="unknown pipeline 'q'"):
        asyncio.run(engine_for(SOFTMAX).run("q", {}, {}))


def test_a_failing_rule_fails_its_request() -> None:
    short = {**LABELS, "labels": ["a"]}
    with pytest.raises(Misconfigured, match="class index 2 has no label"):
        run(engine_for(SOFTMAX, TOPK, short))


# conditions and core_only


@pytest.mark.parametrize(
    ("when", "parameters", "runs"),
    [
        ({"parameter": "explain"}, {"explain": "yes"}, True),
        ({"parameter": "explain"}, {}, False),
        ({"parameter": "mode", "equals": "full"}, {"mode": "full"}, True),
        ({"parameter": "mode", "equals": "full"}, {"mode": "short"}, False),
        ({"parameter": "mode", "equals": "full", "negate": True}, {"mode": "short"}, True),
        ({"tensor": "logits"}, {}, True),
        ({"tensor": "attention_mask"}, {}, False),
        ({"tensor": "attention_mask", "negate": True}, {}, True),
    ],
)
def test_when_conditions(when: dict, parameters: dict, runs: bool) -> None:
    record = {"kind": "test_record", "input": "logits", "when": when}
    outputs, info = run(engine_for(SOFTMAX, record, outputs=("probabilities",)), parameters)
    assert bool(CALLS) is runs and "probabilities" in outputs
    assert info == ({} if runs else {"skipped_rules": "test_record"}), "a rule not run is named"


def test_a_tensor_condition_sees_what_earlier_rules_made() -> None:
    record = {"kind": "test_record", "input": "logits", "when": {"tensor": "probabilities"}}
    run(engine_for(record, SOFTMAX, outputs=("probabilities",)))
    assert not CALLS
    run(engine_for(SOFTMAX, record, outputs=("probabilities",)))
    assert len(CALLS) == 1


def test_core_only_skips_optional_rules_and_what_depends_on_them_naming_each() -> None:
    optional_topk = {**TOPK, "core": False}
    engine = engine_for(SOFTMAX, optional_topk, LABELS)
    outputs, info = run(engine, {"core_only": "true"})
    assert set(outputs) == {"probabilities"} and info == {"skipped_rules": "topk,labels"}
    outputs, _ = run(engine, {"core_only": "FALSE"})
    assert set(outputs) == {"labels", "scores", "probabilities"}
    with pytest.raises(InvalidArgument, match="'core_only' must be 'true' or 'false', got 'yes'"):
        run(engine, {"core_only": "yes"})


def test_bad_conditions_and_names_fail_at_start_up() -> None:
    with pytest.raises(ValueError, match="exactly one of 'parameter' or 'tensor'"):
        SoftmaxRule(kind="softmax", input="x", when={"equals": "x"})
    with pytest.raises(ValueError, match="unknown key 'value'"):
        SoftmaxRule(kind="softmax", input="x", when={"parameter": "a", "value": "x"})
    with pytest.raises(ValueError, match="postprocess rule 'softmax': the name is taken"):
        engine_for(SOFTMAX, SOFTMAX)
    engine_for(SOFTMAX, {**SOFTMAX, "name": "again"})
    with pytest.raises(ValueError, match="rule 'glow': kind: 'glow' is neither a built-in"):
        engine_for({"kind": "glow"})


# time limits


@pytest.mark.timing
def test_an_overrunning_rule_is_skipped_within_its_limit(caplog: pytest.LogCaptureFixture) -> None:
    engine = engine_for(SOFTMAX, sleep(2), TOPK, LABELS)
    tracer = TracerProvider().get_tracer("test")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING), tracer.start_as_current_span("request") as span:
        outputs, info = run(engine)
    elapsed = time.monotonic() - started
    assert LIMIT <= elapsed < LIMIT + MARGIN
    assert info == {"skipped_rules": "test_sleep"}
    # The rules after the skipped one still ran, on the tensors from before it.
    assert set(outputs) == {"labels", "scores", "probabilities"}
    assert engine.metrics.overruns() == {("p", "test_sleep"): 1}
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert any(
        trace_id in r.getMessage() and "test_sleep" in r.getMessage() for r in caplog.records
    )


def test_rules_that_need_a_skipped_rules_output_are_skipped_and_named() -> None:
    engine = engine_for(sleep(2, output="probabilities", name="slow"), TOPK, LABELS)
    outputs, info = run(engine)
    assert info == {"skipped_rules": "slow,topk,labels"}
    assert outputs == {}


def test_an_abandoned_rule_never_changes_the_answer_and_frees_its_thread() -> None:
    engine = engine_for(sleep(0.5), SOFTMAX, outputs=("probabilities", "slept"))
    outputs, info = run(engine)
    assert "slept" not in outputs and info == {"skipped_rules": "test_sleep"}
    assert FINISHED.wait(2)
    time.sleep(0.05)
    assert engine.metrics.stuck_threads == 0
    assert engine.metrics.snapshot()[("p", "test_sleep")].max_seconds >= 0.5


@pytest.mark.timing
def test_a_rule_limit_overrides_the_default() -> None:
    engine = engine_for(sleep(0.3, timeout_seconds=1.0), SOFTMAX, outputs=("slept",))
    outputs, info = run(engine)
    assert info == {} and "slept" in outputs
    quick = engine_for(sleep(2, timeout_seconds=0.05), SOFTMAX, outputs=("slept",))
    started = time.monotonic()
    assert run(quick)[1] == {"skipped_rules": "test_sleep"}
    assert time.monotonic() - started < 0.05 + MARGIN


def test_a_rule_waiting_for_a_thread_is_not_timed_until_it_starts() -> None:
    engine = engine_for(
        sleep(0.1, timeout_seconds=0.15), outputs=("slept",), workers=1, spare_threads=0
    )

    async def go():
        return await asyncio.gather(*(engine.run("p", {"logits": LOGITS}, {}) for _ in range(3)))

    results = asyncio.run(go())
    assert all(info == {} for _, info in results)  # each waited its turn, none overran


@pytest.mark.timing
def test_a_sleeping_rule_does_not_hold_up_concurrent_requests() -> None:
    engine = engine_for(SOFTMAX, sleep(1.0, when={"parameter": "slow"}), TOPK, LABELS)

    async def timed(parameters: dict) -> tuple[float, dict]:
        started = time.monotonic()
        _, info = await engine.run("p", {"logits": LOGITS}, parameters)
        return time.monotonic() - started, info

    async def go():
        slow = [asyncio.create_task(timed({"slow": "1"})) for _ in range(3)]
        await asyncio.sleep(0.02)  # the slow ones are asleep in their rule now
        fast = [await timed({}) for _ in range(20)]
        return await asyncio.gather(*slow), fast

    slow, fast = asyncio.run(go())
    assert all(info == {"skipped_rules": "test_sleep"} for _, info in slow)
    assert all(seconds < LIMIT + MARGIN for seconds, _ in slow)
    assert all(info == {"skipped_rules": "test_sleep"} for _, info in fast), "not asked for"
    assert max(seconds for seconds, _ in fast) < 0.1


@pytest.mark.timing
def test_with_every_worker_in_an_overrun_a_request_waits_at_most_one_limit() -> None:
    engine = engine_for(
        sleep(1.0, when={"parameter": "slow"}), SOFTMAX, outputs=("probabilities",), workers=1
    )

    async def go():
        slow = asyncio.create_task(engine.run("p", {"logits": LOGITS}, {"slow": "1"}))
        await asyncio.sleep(0.02)
        started = time.monotonic()
        _, info = await engine.run("p", {"logits": LOGITS}, {})
        waited = time.monotonic() - started
        await slow
        return waited, info

    waited, info = asyncio.run(go())
    # The abandoned rule gives up its worker slot at its limit, not when it ends.
    assert info == {"skipped_rules": "test_sleep"} and waited < LIMIT + MARGIN  # not asked


@pytest.mark.timing
def test_a_catastrophic_regex_is_skipped_and_stalls_nothing() -> None:
    regex = {
        "kind": "regex_filter",
        "input": "text",
        "output": "flagged",
        "pattern": r"(\w|\w\w)*\d",
    }
    engine = engine_for(regex, SOFTMAX, outputs=("probabilities", "flagged"))
    text = np.array([b"a" * 5000], dtype=object)

    async def go():
        started = time.monotonic()
        stalled = asyncio.create_task(engine.run("p", {"text": text, "logits": LOGITS}, {}))
        await asyncio.sleep(0.02)
        fast_started = time.monotonic()
        fast = await engine.run(
            "p", {"text": np.array([b"a1"], dtype=object), "logits": LOGITS}, {}
        )
        fast_seconds = time.monotonic() - fast_started
        outputs, info = await stalled
        return time.monotonic() - started, outputs, info, fast, fast_seconds

    elapsed, outputs, info, fast, fast_seconds = asyncio.run(go())
    assert info == {"skipped_rules": "regex_filter"} and "probabilities" in outputs
    assert elapsed < LIMIT + MARGIN
    assert fast[0]["flagged"].tolist() == [True] and fast_seconds < 0.1


def test_a_cancelled_request_stops_at_the_next_rule() -> None:
    record = {"kind": "test_record", "input": "logits"}
    engine = engine_for(sleep(0.3, timeout_seconds=5), record, outputs=("slept",))

    async def go():
        task = asyncio.create_task(engine.run("p", {"logits": LOGITS}, {}))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    assert FINISHED.wait(2)
    time.sleep(0.05)
    assert not CALLS  # the rule after the cancelled one never ran


# protecting rules fail closed

EMAIL = {
    **{"kind": "regex_filter", "name": "redact_email", "input": "text", "action": "redact"},
    **{"pattern": r"[\w.+-]+@[\w-]+\.[\w.]+", "timeout_seconds": 0.05},
}


def test_a_protecting_rule_over_its_limit_refuses_the_answer() -> None:
    engine = engine_for(EMAIL, outputs=("text",))
    text = ("lorem ipsum " * 300_000 + "write to someone@example.com").encode()  # 3.6 MB
    with pytest.raises(Unavailable, match=r"withheld.*'redact_email' \(0.05s\)"):
        run(engine, tensors={"text": np.array([text], dtype=object)})
    short = np.array([b"write to someone@example.com"], dtype=object)
    assert run(engine, tensors={"text": short})[0]["text"].tolist() == [b"write to ***"]


def test_a_protecting_rule_skipped_for_a_skipped_input_refuses_but_when_may_pass_it() -> None:
    sleepy = sleep(2, output="text", protects=False)
    redact = {**EMAIL, "input": "text", "timeout_seconds": 1.0}
    with pytest.raises(Unavailable, match="redact_email"):
        run(engine_for(sleepy, redact, outputs=("text",)))
    protected = {**sleep(2, output="slept", protects=True)}
    with pytest.raises(Unavailable, match="test_sleep"):
        run(engine_for(protected, SOFTMAX, outputs=("probabilities", "slept")))
    asked = {**protected, "when": {"parameter": "careful"}}
    _, info = run(engine_for(asked, SOFTMAX, outputs=("probabilities", "slept")))
    assert info == {"skipped_rules": "test_sleep"}, "its `when` did not hold: by choice"


def test_redaction_protects_by_default_and_a_protecting_rule_must_be_core() -> None:
    built = engine_for(EMAIL, {**EMAIL, "name": "flag", "action": "flag", "output": "f"})
    assert [r.protects for r in built.get("p").rules] == [True, False]
    with pytest.raises(ValidationError, match=r"a protecting rule .* must be core"):
        engine_for({**EMAIL, "core": False})
    unprotected = engine_for({**EMAIL, "core": False, "protects": False})
    assert not unprotected.get("p").rules[0].protects


# where a chain runs


@pytest.mark.parametrize(
    ("rules", "inline_max_bytes", "on_the_loop"),
    [
        ((SOFTMAX, TOPK, LABELS), 16384, True),  # bounded rules, a small input
        ((SOFTMAX, TOPK, LABELS), 4, False),  # the input is over the bound
        ((SOFTMAX, {"kind": "test_record", "input": "logits"}), 16384, False),  # not bounded
    ],
)
def test_a_small_chain_of_bounded_rules_runs_on_the_event_loop(
    rules: tuple, inline_max_bytes: int, on_the_loop: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_for(*rules, outputs=("probabilities",), inline_max_bytes=inline_max_bytes)
    handed_off = []
    submit = engine._pool.submit
    monkeypatch.setattr(engine._pool, "submit", lambda *a: handed_off.append(1) or submit(*a))
    outputs, _ = run(engine)
    np.testing.assert_allclose(outputs["probabilities"].sum(), 1.0, rtol=1e-6)
    assert (not handed_off) == on_the_loop
