"""A stateful model in process: its sequence section checked against its graph and
described in its config, its state kept per sequence, and its sequences across versions."""

from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from models import accumulator
from services.inference.jobs import Request
from services.inference.manager import ModelManager
from services.inference.sequence_graph import check_model
from services.inference.sequences import Sequences
from services.inference.signature import Signature
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument
from strata.models.onnxsig import TensorInfo
from strata.proto.inference import model_config_pb2 as mc
from strata.wire.triton_sequences import Flags, ModelSequence
from strata.wire.v2meta import model_config


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
