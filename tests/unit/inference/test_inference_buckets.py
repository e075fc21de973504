"""A padded batch runs in buckets of like length: trailing padding cut, answers unchanged."""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest

from services.inference import buckets
from services.inference.buckets import Buckets, plan
from services.inference.manifest import read_spec
from services.inference.model import ModelVersion, load_version
from strata.config.inference import InferenceSettings
from strata.wire.codec import Arrays
from tests.unit.inference.test_inference_toymodels import VOCAB, pooling_model, write_version

SETTINGS = InferenceSettings(models=["pool"], workers=1)


def pooled_only() -> onnx.ModelProto:
    """The pooling model without its per-token output: no answer has the sequence dim."""
    model = pooling_model()
    kept = [o for o in model.graph.output if o.name == "pooled"]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model


def padded_rows(lengths: list[int], width: int, seed: int = 0) -> list[Arrays]:
    """One-row requests of real tokens (never the pad id 0), padded with zeros to `width`."""
    rng = np.random.default_rng(seed)
    requests = []
    for n in lengths:
        ids = np.zeros((1, width), np.int64)
        mask = np.zeros((1, width), np.float32)
        ids[0, :n] = rng.integers(1, VOCAB, size=n)
        mask[0, :n] = 1
        requests.append({"ids": ids, "mask": mask})
    return requests


def load(root: Path, model: onnx.ModelProto) -> ModelVersion:
    write_version(root, "pool", 1, model, [], {"padding": {"ids": 0, "mask": 0}})
    spec = read_spec(root / "pool" / "model.yaml", SETTINGS)
    return load_version(root / "pool" / "1", "pool", 1, spec, ThreadPoolExecutor(1), "t")


def recording(run: Callable[[Arrays], Arrays], shapes: list) -> Callable[[Arrays], Arrays]:
    def recorded(batch: Arrays) -> Arrays:
        shapes.append(batch["ids"].shape)
        return run(batch)

    return recorded


def test_a_row_s_length_ends_at_its_last_cell_that_is_not_padding() -> None:
    (one,) = padded_rows([3], 6)
    batch = {name: np.concatenate([one[name]] * 2) for name in one}
    batch["mask"][1, 4] = 1  # the mask alone says the second row is longer
    empty = {"ids": np.zeros((1, 6), np.int64), "mask": np.zeros((1, 6), np.float32)}
    pads = {"ids": 0.0, "mask": 0.0}
    assert Buckets(pads, 1.0).lengths(batch).tolist() == [3, 5]
    assert Buckets(pads, 1.0).lengths(empty).tolist() == [1]


@pytest.mark.parametrize(
    ("lengths", "call_cells", "runs"),
    [
        ([1, 1, 10, 10], 1.0, [(0, 2), (2, 4)]),  # splitting saves 18 cells for one call
        ([1, 1, 10, 10], 30.0, [(0, 4)]),  # a call costs more than the padding
        ([2, 3, 40], math.inf, [(0, 3)]),  # never split
        ([5], 1.0, [(0, 1)]),
    ],
)
def test_the_plan_splits_where_a_call_costs_less_than_the_padding_it_saves(
    lengths: list[int], call_cells: float, runs: list[tuple[int, int]]
) -> None:
    assert plan(np.array(lengths), call_cells) == runs


def test_a_flight_padded_to_its_longest_runs_cut_with_equal_answers(tmp_path: Path) -> None:
    model = load(tmp_path, pooled_only())
    lengths = [2, 9, 3, 2, 9, 3]
    requests = padded_rows(lengths, 12, seed=1)
    shapes: list = []
    model.run = recording(model.run, shapes)  # type: ignore[method-assign]
    answers = model.run_requests(requests)
    assert shapes and all(width <= 9 for _, width in shapes)  # never the 12 they came as
    assert sum(rows for rows, _ in shapes) == len(requests)
    for request, answer, n in zip(requests, answers, lengths, strict=True):
        alone = model.run({name: values[:, :n] for name, values in request.items()})
        np.testing.assert_allclose(answer["pooled"], alone["pooled"], rtol=1e-6, atol=1e-6)


def test_buckets_run_rows_of_like_length_together_and_answer_in_row_order(
    tmp_path: Path,
) -> None:
    model = load(tmp_path, pooled_only())
    requests = padded_rows([2, 9, 3, 2, 9, 3], 12, seed=2)
    batch = {name: np.concatenate([r[name] for r in requests]) for name in requests[0]}
    shapes: list = []
    outputs = Buckets({"ids": 0.0, "mask": 0.0}, 1.0).run(batch, recording(model.run, shapes))
    assert sorted(shapes) == [(2, 2), (2, 3), (2, 9)]
    np.testing.assert_allclose(outputs["pooled"], model.run(batch)["pooled"], atol=1e-6)


def test_a_model_with_an_answer_per_token_is_not_cut(tmp_path: Path) -> None:
    model = load(tmp_path, pooling_model())
    assert buckets.buckets_of(model.signature) is None
    requests = padded_rows([2, 5], 8)
    answers = model.run_requests(requests)
    assert [a["tokens"].shape for a in answers] == [(1, 8, 4), (1, 8, 4)]


def test_the_call_s_own_cost_is_measured_in_padded_cells(tmp_path: Path) -> None:
    model = load(tmp_path, pooled_only())
    pads = buckets.buckets_of(model.signature)
    assert pads == {"ids": 0.0, "mask": 0.0}
    assert 0 <= buckets.calibrate(model.signature, pads, model.run) <= math.inf
