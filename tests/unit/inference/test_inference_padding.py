"""Variable sequence lengths: padding to the longest in a batch, masks, and cutting back."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from services.inference.jobs import Request
from services.inference.manifest import read_spec
from services.inference.model import ModelVersion, load_version
from strata.config.inference import InferenceSettings
from strata.errors import InvalidArgument, NotReady
from tests.unit.inference.test_inference_toymodels import (
    _finish,
    pooling_model,
    tokens,
    write_version,
)

SETTINGS = InferenceSettings(models=["pool"], workers=2)
LENGTHS = [3, 7, 1, 5, 7, 2]


def load(root: Path, name: str, version: int = 1) -> ModelVersion:
    spec = read_spec(root / name / "model.yaml", SETTINGS)
    folder = root / name / str(version)
    return load_version(folder, name, version, spec, ThreadPoolExecutor(2), "test")


@pytest.fixture
def padded(tmp_path: Path) -> ModelVersion:
    manifest = {"padding": {"ids": 0, "mask": 0}}
    write_version(tmp_path, "pool", 1, pooling_model(), tokens([2, 5, 3]), manifest)
    return load(tmp_path, "pool")


def alone(model: ModelVersion, request: dict) -> dict:
    return model.run(request)


def test_padded_inputs_share_a_key_and_mismatched_ones_are_refused(
    padded: ModelVersion,
) -> None:
    a, b = tokens([3, 6])
    assert padded.signature.check(a) == padded.signature.check(b)
    assert padded.signature.check(a)[0] == 1
    broken = {"ids": a["ids"], "mask": np.ones((1, 4), np.float32)}
    with pytest.raises(InvalidArgument, match="share dimension 'seq' but have sizes 3 and 4"):
        padded.signature.check(broken)


def test_a_requests_padded_length_is_its_longest_padded_input_per_row(
    padded: ModelVersion, tmp_path: Path
) -> None:
    (three,) = tokens([3])
    assert padded.signature.padded_length(three) == 3  # ids [1, 3], mask [1, 3]
    write_version(tmp_path / "plain", "pool", 1, pooling_model(), tokens([2]), {})
    plain = load(tmp_path / "plain", "pool")
    assert plain.signature.padded_length(three) == 0  # nothing is padded


def test_batched_answers_equal_unbatched_answers(padded: ModelVersion) -> None:
    requests = tokens(LENGTHS, seed=1)
    batched = padded.run_requests(requests)
    for request, answer, n in zip(requests, batched, LENGTHS, strict=True):
        expected = alone(padded, request)
        assert answer["tokens"].shape == (1, n, 4)  # cut back to its own length
        np.testing.assert_allclose(answer["tokens"], expected["tokens"], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(answer["pooled"], expected["pooled"], rtol=1e-6, atol=1e-6)


def test_the_batcher_pads_concurrent_requests_of_different_lengths(padded: ModelVersion) -> None:
    requests = tokens(LENGTHS * 4, seed=2)

    async def go() -> list[dict]:
        return await asyncio.gather(*(padded.infer(r, Request()) for r in requests))

    answers = asyncio.run(go())
    assert max(padded.stats.batch_sizes) > 1
    for request, answer in zip(requests, answers, strict=True):
        expected = alone(padded, request)
        np.testing.assert_allclose(answer["pooled"], expected["pooled"], rtol=1e-6, atol=1e-6)
        assert answer["tokens"].shape == expected["tokens"].shape


def test_without_padding_lengths_never_share_a_batch(tmp_path: Path) -> None:
    write_version(tmp_path, "pool", 1, pooling_model(), tokens([2, 5]))
    model = load(tmp_path, "pool")
    a, b = tokens([3, 6])
    assert model.signature.check(a)[1] != model.signature.check(b)[1]
    with pytest.raises(ValueError, match="cannot share a batch unpadded"):
        model.run_requests([a, b])


def mean_without_mask() -> onnx.ModelProto:
    """Averages over the sequence with no mask: padding changes its answers."""
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[1], keepdims=0)],
        "mean",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])],
    )
    return _finish(graph)


def test_a_model_whose_answers_change_when_padded_is_refused(tmp_path: Path) -> None:
    cases = [{"x": np.ones((1, n), np.float32)} for n in (2, 4)]
    write_version(tmp_path, "mean", 1, mean_without_mask(), cases, {"padding": {"x": 0}})
    with pytest.raises(NotReady, match=r"case_000.*when batched with \['case_001'\]"):
        load(tmp_path, "mean")
