"""The preprocess servicer on a real aio server: image and text pipelines over the wire,
bad requests failing alone, per-step timings, slow requests not blocking others, and flights
of the default config's pipelines."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers

from services.preprocess.app import build_pipelines
from services.preprocess.metrics import StepTimings, Summary
from services.preprocess.pipeline import PreprocessPipelines, build_pipeline
from services.preprocess.servicer import PreprocessServicer
from services.preprocess.steps import STEPS
from strata.config import load_settings
from strata.config.base import stage_union
from strata.config.pipelines import Pipeline
from strata.config.preprocess import BUILTIN_STEPS, PluginStep, StepSpec
from strata.config.server import ServerSettings
from strata.proto.v1 import preprocess_pb2_grpc
from strata.proto.v1 import tensor_pb2 as v1
from strata.rpc.server import start_server
from strata.wire import codec
from strata.wire.codec import Arrays
from tests.support.flight_requests import alone, by_member, flight
from tests.support.results import raise_for_result
from tests.support.system import make_config


class PauseSpec(StepSpec):
    kind: Literal["test_pause"]
    seconds: float


@dataclass
class Pause:
    """Test-only: a step that takes a while."""

    options: PauseSpec

    def process(self, tensors: Arrays) -> Arrays:
        time.sleep(self.options.seconds)
        return tensors


@pytest.fixture(autouse=True)
def _test_steps(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(STEPS.classes, "test_pause", Pause)


# The built-in kinds and this module's test-only ones.
TestStep = stage_union((*BUILTIN_STEPS, PauseSpec), PluginStep)


class WithTestSteps(Pipeline):
    """A pipeline whose steps may also be this module's test-only one."""

    preprocess: list[TestStep] = []


def pipeline(inputs: list[dict], steps: list[dict]) -> Pipeline:
    return WithTestSteps.model_validate(
        {
            "inputs": inputs,
            "outputs": [{"name": "out", "datatype": "FP32", "shape": [-1]}],
            "model": {"name": "m"},
            "preprocess": steps,
        }
    )


BYTES_INPUT = {"datatype": "BYTES", "shape": [-1], "max_shape": [8]}
SPECS = {
    "images": pipeline(
        [{"name": "image", **BYTES_INPUT}],
        [
            {"kind": "decode", "input": "image", "mode": "L", "max_pixels": 4096},
            {"kind": "resize", "input": "image", "height": 4, "width": 4},
            {"kind": "scale", "input": "image", "factor": 0.00392156862745098},
        ],
    ),
    "text": pipeline(
        [{"name": "text", **BYTES_INPUT, "utf8": True}],
        [
            {"kind": "normalize_text", "input": "text", "lowercase": True, "unicode": "NFKC"},
            {"kind": "tokenize", "input": "text", "tokenizer": "tokenizer.json", "max_length": 6},
        ],
    ),
    "slow": pipeline(
        [{"name": "x", "datatype": "FP32", "shape": [-1, 1]}],
        [{"kind": "test_pause", "seconds": 0.5}],
    ),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("repo")
    vocab = {"[PAD]": 0, "[UNK]": 1, "red": 2, "fox": 3}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    return folder


def built(repository: Path, timings: StepTimings) -> PreprocessPipelines:
    return PreprocessPipelines(
        {name: build_pipeline(name, spec, repository, timings) for name, spec in SPECS.items()}
    )


@asynccontextmanager
async def preprocess(pipelines: PreprocessPipelines) -> AsyncIterator[grpc.aio.Channel]:
    registration = (
        PreprocessServicer(pipelines),
        preprocess_pb2_grpc.add_PreprocessServicer_to_server,
        "strata.v1.Preprocess",
    )
    running = await start_server([registration], "127.0.0.1:0", ServerSettings())
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield channel
    finally:
        await channel.close()
        await running.server.stop(0)


def request(rid: str, pipeline: str, **arrays: np.ndarray) -> v1.Request:
    return v1.Request(id=rid, pipeline=pipeline, tensors=codec.arrays_to_tensors(arrays))


def strings(*items: bytes) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def call(pipelines: PreprocessPipelines, *requests: v1.Request) -> list[v1.Result]:
    async def go():
        async with preprocess(pipelines) as channel:
            stub = preprocess_pb2_grpc.PreprocessStub(channel)
            return list((await stub.Process(v1.ProcessRequest(requests=requests))).results)

    return asyncio.run(go())


def test_images_and_text_over_the_wire_with_bad_requests_failing_alone(repository: Path) -> None:
    timings = StepTimings()
    white = png(np.full((8, 8), 255, np.uint8))
    results = call(
        built(repository, timings),
        request("ok", "images", image=strings(white, png(np.zeros((8, 8, 3), np.uint8)))),
        request("cut", "images", image=strings(white[:30])),
        request("huge", "images", image=strings(png(np.zeros((100, 100), np.uint8)))),
        request("words", "text", text=strings(b"  Red FOX ", b"\xef\xbc\xb2ed")),
        request("latin1", "text", text=strings(b"caf\xe9")),
    )
    ok, cut, huge, words, latin1 = results
    pixels = raise_for_result(ok)["image"]
    assert pixels.shape == (2, 4, 4) and np.allclose(pixels[0], 1) and np.allclose(pixels[1], 0)
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert cut.error.code == invalid and "input 'image': element 0" in cut.error.message
    assert huge.error.code == invalid and "10000 pixels, more than the 4096" in huge.error.message
    tokens = raise_for_result(words)
    # Lowercased, stripped, and NFKC folds the full-width R: "red fox" and "red", padded.
    assert tokens["input_ids"].tolist() == [[2, 3], [2, 0]]
    assert tokens["attention_mask"].tolist() == [[1, 1], [1, 0]]
    assert latin1.error.code == invalid and "not valid UTF-8" in latin1.error.message
    steps = {step for pipeline, step in timings.snapshot() if pipeline == "images"}
    assert steps == {"validate", "decode", "resize", "scale"}
    assert timings.snapshot()[("images", "validate")].count == 3


@pytest.mark.timing
def test_a_slow_request_blocks_neither_other_calls_nor_health(repository: Path) -> None:
    async def timed(coroutine) -> float:
        started = time.monotonic()
        await coroutine
        return time.monotonic() - started

    async def go():
        async with preprocess(built(repository, StepTimings())) as channel:
            stub = preprocess_pb2_grpc.PreprocessStub(channel)
            health = health_pb2_grpc.HealthStub(channel)
            slow_call = v1.ProcessRequest(requests=[request("s", "slow", x=np.zeros((1, 1), "f4"))])
            fast_call = v1.ProcessRequest(requests=[request("f", "text", text=strings(b"fox"))])
            await stub.Process(fast_call)
            slow = asyncio.create_task(timed(stub.Process(slow_call)))
            await asyncio.sleep(0.05)
            fast = await timed(stub.Process(fast_call))
            check = await timed(health.Check(health_pb2.HealthCheckRequest()))
            return await slow, fast, check

    slow, fast, check = asyncio.run(go())
    assert slow >= 0.5 and fast < 0.2 and check < 0.2


# Flights of the default config's pipelines (built under build/ by `make models`).


@pytest.fixture(scope="module")
def default(tmp_path_factory: pytest.TempPathFactory) -> tuple[PreprocessPipelines, StepTimings]:
    settings = load_settings(make_config(tmp_path_factory.mktemp("default")))
    timings = StepTimings()
    return build_pipelines(settings, timings), timings


INPUTS = {
    "digits": lambda rng, n: {"images": rng.integers(0, 256, (n, 16, 16), dtype=np.uint8)},
    "tabular": lambda rng, n: {"features": rng.normal(size=(n, 30)).astype(np.float32)},
}


def members(pipeline: str, counts: list[int]) -> dict[str, dict[str, np.ndarray]]:
    """Random inputs of `pipeline`, one member per count of rows."""
    rng = np.random.default_rng(len(counts))
    return {f"{pipeline}{i}": INPUTS[pipeline](rng, n) for i, n in enumerate(counts)}


def same_as_alone(flown: v1.Result, separate: list[v1.Result]) -> None:
    """Each member of `flown` answered in `separate` got the same tensors there."""
    answers = by_member(flown)
    for result in separate:
        expected = raise_for_result(result)
        assert answers[result.id].keys() == expected.keys()
        for name, array in expected.items():
            np.testing.assert_array_equal(answers[result.id][name], array)


@pytest.mark.parametrize("pipeline", ["digits", "tabular"])
def test_a_flight_runs_each_step_once_and_matches_separate_requests(
    default: tuple[PreprocessPipelines, StepTimings], pipeline: str
) -> None:
    pipelines, timings = default
    group = members(pipeline, [1, 3, 2])
    before = timings.snapshot()
    (flown,) = call(pipelines, flight(pipeline, group))
    after = timings.snapshot()
    assert [(m.id, m.rows) for m in flown.members] == [
        (f"{pipeline}0", 1),
        (f"{pipeline}1", 3),
        (f"{pipeline}2", 2),
    ]
    steps = [key for key in after if key[0] == pipeline]
    assert steps and all(after[key].count == before.get(key, Summary()).count + 1 for key in steps)
    same_as_alone(flown, call(pipelines, *alone(pipeline, group)))


def test_a_bad_member_fails_alone_and_an_oversized_flight_still_answers_all(
    default: tuple[PreprocessPipelines, StepTimings],
) -> None:
    pipelines, _ = default
    group = members("tabular", [2, 1, 3])
    group["tabular1"]["features"][0, 4] = np.nan
    big = members("tabular", [40, 40])  # 80 rows: over max_batch_size 64 together
    bad, oversized = call(pipelines, flight("tabular", group), flight("tabular", big))
    answers = by_member(bad)
    assert answers["tabular1"].code == grpc.StatusCode.INVALID_ARGUMENT
    assert "NaN" in str(answers["tabular1"])
    assert [m.rows for m in bad.members] == [2, 0, 3]
    del group["tabular1"]
    same_as_alone(bad, call(pipelines, *alone("tabular", group)))
    same_as_alone(oversized, call(pipelines, *alone("tabular", big)))


class ThreadNoting:
    """A stand-in pipeline that passes its tensors on and notes the thread it ran on."""

    def __init__(self) -> None:
        self.threads: list[int] = []

    def for_version(self, version: str) -> ThreadNoting:
        return self

    def run(self, tensors: Arrays) -> Arrays:
        self.threads.append(threading.get_ident())
        return tensors


def test_small_calls_run_on_the_loop_and_large_ones_on_a_worker() -> None:
    noting = ThreadNoting()
    servicer = PreprocessServicer(PreprocessPipelines({"p": noting}), inline_max_bytes=1024)

    async def go() -> int:
        for size in (16, 4096):
            call = v1.ProcessRequest(requests=[request(str(size), "p", x=np.zeros(size, np.uint8))])
            (result,) = (await servicer.Process(call, None)).results
            assert not result.HasField("error")
        return threading.get_ident()

    loop_thread = asyncio.run(go())
    assert [t == loop_thread for t in noting.threads] == [True, False]
