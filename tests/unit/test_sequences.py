"""Sequences without sockets: a request's flags, the live sequences of one model or pipeline
(order, START/END, limits, idle timeout), and a stateful model run in process."""

from __future__ import annotations

import asyncio
import functools
import shutil
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from models import accumulator
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, Overloaded
from strata.inference.jobs import Request
from strata.inference.manager import ModelManager
from strata.inference.sequences import Sequences, check_model
from strata.inference.signature import Signature
from strata.onnxsig import TensorInfo
from strata.proto.inference import grpc_service_pb2 as v2
from strata.proto.inference import model_config_pb2 as mc
from strata.sequences import Flags, Live, ModelSequence, sequence_flags
from strata.v2meta import model_config


def synchronously(test: Callable[[], Coroutine]) -> Callable[[], None]:
    """Run an async test on a loop of its own."""
    return functools.wraps(test)(lambda: asyncio.run(test()))


def parameters(**values: object) -> dict[str, v2.InferParameter]:
    request = v2.ModelInferRequest()
    for key, value in values.items():
        field = {bool: "bool_param", int: "uint64_param", str: "string_param"}[type(value)]
        setattr(request.parameters[key], field, value)
    return dict(request.parameters)


def test_a_request_of_no_sequence_has_no_flags() -> None:
    assert sequence_flags(parameters()) is None
    assert sequence_flags(parameters(sequence_id=0)) is None
    assert sequence_flags(parameters(sequence_id="")) is None


def test_flags_take_uint64_and_string_ids() -> None:
    assert sequence_flags(parameters(sequence_id=7, sequence_start=True)) == Flags(7, True)
    assert sequence_flags(parameters(sequence_id="a", sequence_end=True)) == Flags("a", end=True)


@pytest.mark.parametrize(
    ("values", "words"),
    [
        ({"sequence_start": True}, "need a sequence_id"),
        ({"sequence_id": 1, "sequence_end": "yes"}, "'sequence_end' must be a bool"),
        ({"sequence_id": True}, "must be a uint64 or a string, got bool_param"),
        ({"sequence_id": "x" * 300}, "longer than 256 characters"),
    ],
)
def test_bad_flags_are_refused_naming_why(values: dict, words: str) -> None:
    with pytest.raises(InvalidArgument, match=words):
        sequence_flags(parameters(**values))


def test_a_negative_int64_id_is_refused() -> None:
    request = v2.ModelInferRequest()
    request.parameters["sequence_id"].int64_param = -3
    with pytest.raises(InvalidArgument, match="must not be negative"):
        sequence_flags(request.parameters)


async def step(live: Live[list], flags: Flags, log: list, item: object, pause: float = 0) -> None:
    async with live.turn(flags, list) as entry:
        await asyncio.sleep(pause)
        entry.value.append(item)
        log.append(item)


@synchronously
async def test_requests_of_one_sequence_run_one_at_a_time_in_arrival_order() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    log: list = []
    await step(live, Flags(1, start=True), log, "start")
    # The first waits longest: without turns, the later ones would finish before it.
    await asyncio.gather(*(step(live, Flags(1), log, i, (5 - i) / 100) for i in range(5)))
    assert log == ["start", 0, 1, 2, 3, 4]


@synchronously
async def test_an_end_frees_the_sequence_and_a_start_makes_it_again() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    log: list = []
    await step(live, Flags(1, start=True), log, 1)
    await step(live, Flags(1, end=True), log, 2)
    assert len(live) == 0
    with pytest.raises(InvalidArgument, match="sequence 1 of model 'm' is not active"):
        await step(live, Flags(1), log, 3)
    async with live.turn(Flags(1, start=True), list) as entry:
        assert entry.value == []  # a fresh value


@synchronously
async def test_a_failed_request_leaves_the_sequence_but_a_failed_start_does_not() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    with pytest.raises(ValueError):
        async with live.turn(Flags(1, start=True), list):
            raise ValueError("bad input")
    assert len(live) == 0
    await step(live, Flags(2, start=True), [], 1)
    with pytest.raises(ValueError):
        async with live.turn(Flags(2, end=True), list):
            raise ValueError("bad input")
    async with live.turn(Flags(2), list) as entry:
        assert entry.value == [1]


@synchronously
async def test_sequences_of_two_scopes_never_meet() -> None:
    live: Live[list] = Live("model 'm'", 10, 8)
    await step(live, Flags(1, start=True, scope="alice"), [], "alice's")
    with pytest.raises(InvalidArgument, match="not active"):
        await step(live, Flags(1, scope="mallory"), [], "mallory's")


@synchronously
async def test_past_the_limit_a_start_is_refused_until_one_idles_out() -> None:
    live: Live[list] = Live("pipeline 'p'", 0.05, 2)
    for sequence in (1, 2):
        await step(live, Flags(sequence, start=True), [], sequence)
    with pytest.raises(Overloaded, match="pipeline 'p' holds 2 sequences, its most") as refused:
        await step(live, Flags(3, start=True), [], 3)
    assert refused.value.retry_after == 0.05
    await asyncio.sleep(0.1)
    await step(live, Flags(3, start=True), [], 3)
    assert len(live) == 1
    with pytest.raises(InvalidArgument, match="idle longer than 50000 µs"):
        await step(live, Flags(1), [], 1)


@synchronously
async def test_an_unknown_sequence_may_go_on_where_its_keeper_allows() -> None:
    live: Live[str] = Live("pipeline 'p'", 10, 8)
    async with live.turn(Flags(9), str, unknown=True) as entry:
        entry.value = "arm"
    async with live.turn(Flags(9), str, unknown=True) as entry:
        assert entry.value == "arm"


def info(name: str, datatype: str, shape: tuple[int, ...] = (-1, 1)) -> TensorInfo:
    return TensorInfo(name, datatype, shape, (None,) * len(shape))


@pytest.mark.parametrize(
    ("section", "words"),
    [
        ({"control": {"start": "GO"}}, "names 'GO', which is no input"),
        ({"control": {"start": "x"}}, "START input 'x' is FP64"),
        ({"state": [{"input": "s", "output": "y"}]}, "state 'y' .* must match input 's'"),
        ({"state": [{"input": "wide", "output": "wide_out"}]}, "needs fixed dimensions"),
    ],
)
def test_a_sequence_section_that_does_not_fit_the_graph_is_refused(
    section: dict, words: str
) -> None:
    inputs = [info("x", "FP64"), info("s", "FP32"), info("wide", "FP32", (-1, -1))]
    outputs = [info("y", "FP64"), info("wide_out", "FP32", (-1, -1))]
    signature = Signature("m", inputs, outputs, 8, {})
    with pytest.raises(InvalidArgument, match=words):
        check_model(signature, ModelSequence.model_validate(section))


def test_the_state_follows_each_sequence_and_a_refused_request_keeps_it(tmp_path: Path) -> None:
    accumulator.write(tmp_path)
    settings = InferenceSettings(models=[accumulator.NAME])

    async def run() -> None:
        with ThreadPoolExecutor(2) as executor:
            models = ModelManager(tmp_path / "repository", settings, executor)
            await models.start()
            try:
                await drive(Sequences(models.resolve))
            finally:
                await models.close()

    asyncio.run(run())


async def drive(sequences: Sequences) -> None:
    async def add(flags: Flags, number: float, dtype: type = np.float32) -> list:
        arrays = {"value": np.array([[number]], dtype)}
        _, outputs = await sequences.infer(accumulator.NAME, "", flags, arrays, Request())
        return [outputs["total"].item(), outputs["controls"].tolist()[0]]

    assert await add(Flags(1, start=True), 1) == [1, [1, 0, 1]]
    assert await add(Flags("b", start=True), 10) == [10, [1, 0, 1]]
    with pytest.raises(InvalidArgument, match="datatype FP64, expected FP32"):
        await add(Flags(1), 100, np.float64)
    assert await add(Flags(1), 2) == [3, [0, 0, 1]]
    assert await add(Flags("b", end=True), 5) == [15, [0, 1, 1]]
    with pytest.raises(InvalidArgument, match="is the server's to fill"):
        arrays = {"value": np.ones((1, 1), np.float32), "START": np.ones((1, 1), bool)}
        await sequences.infer(accumulator.NAME, "", Flags(1), arrays, Request())


def test_a_stateful_models_config_describes_its_controls_and_state_not_as_inputs() -> None:
    inputs = [
        info("value", "FP32"),
        info("state_in", "FP32"),
        info("START", "BOOL"),
        info("READY", "INT32"),
        info("CORRID", "UINT64"),
    ]
    outputs = [info("total", "FP32"), info("state_out", "FP32")]
    section = ModelSequence.model_validate(
        {
            "control": {"start": "START", "ready": "READY", "corrid": "CORRID"},
            "state": [{"input": "state_in", "output": "state_out"}],
            "max_sequence_idle_microseconds": 2_000_000,
        }
    )
    config = model_config("m", "onnxruntime_onnx", 8, inputs, outputs, section).config
    assert [i.name for i in config.input] == ["value"]
    assert [o.name for o in config.output] == ["total"]
    batching = config.sequence_batching
    assert batching.HasField("direct") and batching.max_sequence_idle_microseconds == 2_000_000
    controls = {c.name: c.control[0] for c in batching.control_input}
    assert list(controls["START"].bool_false_true) == [False, True]
    assert list(controls["READY"].int32_false_true) == [0, 1]
    assert controls["CORRID"].data_type == mc.TYPE_UINT64
    (state,) = batching.state
    assert (state.input_name, state.output_name, list(state.dims)) == ("state_in", "state_out", [1])


def test_a_sequence_stays_on_its_version_and_ends_when_it_stops_serving(tmp_path: Path) -> None:
    accumulator.write(tmp_path)
    root = tmp_path / "repository"
    manifest = root / accumulator.NAME / "model.yaml"
    manifest.write_text(manifest.read_text() + "version_policy: {latest: 2}\n")
    settings = InferenceSettings(models=[accumulator.NAME])
    one = {"value": np.ones((1, 1), np.float32)}

    async def run() -> None:
        with ThreadPoolExecutor(2) as executor:
            models = ModelManager(root, settings, executor)
            await models.start()
            sequences = Sequences(models.resolve)
            try:
                await sequences.infer(accumulator.NAME, "", Flags(1, start=True), one, Request())
                shutil.copytree(root / accumulator.NAME / "1", root / accumulator.NAME / "2")
                await models.load(accumulator.NAME)  # 1 and 2 serve; 2 is the latest
                version, outputs = await sequences.infer(
                    accumulator.NAME, "", Flags(1), one, Request()
                )
                assert (version.version, outputs["total"].item()) == (1, 2.0)
                manifest.write_text(manifest.read_text().replace("latest: 2", "latest: 1"))
                await models.load(accumulator.NAME)  # only 2 serves now
                with pytest.raises(
                    InvalidArgument, match="started on model 'accumulator' version 1"
                ):
                    await sequences.infer(accumulator.NAME, "", Flags(1), one, Request())
                with pytest.raises(InvalidArgument, match="is not active"):  # it is gone
                    await sequences.infer(accumulator.NAME, "", Flags(1), one, Request())
            finally:
                await models.close()

    asyncio.run(run())
