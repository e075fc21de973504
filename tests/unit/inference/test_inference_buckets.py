"""A padded batch runs in buckets of like length: trailing padding cut, answers unchanged."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
from tokenizers import Tokenizer

from bench.text import SENTENCES
from services.inference import buckets
from services.inference.buckets import Buckets, Costs, fit, plan
from services.inference.jobs import Request
from services.inference.manifest import read_spec
from services.inference.model import ModelVersion, load_version
from strata.config.inference import InferenceSettings
from strata.wire.codec import Arrays
from tests.unit.inference.test_inference_toymodels import (
    VOCAB,
    pooling_model,
    tokens,
    write_version,
)

SETTINGS = InferenceSettings(models=["pool"], workers=1)
MINILM = Path(__file__).resolve().parents[3] / "build" / "repository" / "minilm"


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


def recording_as(
    run: Callable[[Arrays], Arrays], shapes: list, name: str
) -> Callable[[Arrays], Arrays]:
    """`run`, noting the shape of its `name` input at each call."""

    def recorded(batch: Arrays) -> Arrays:
        shapes.append(batch[name].shape)
        return run(batch)

    return recorded


def recording(run: Callable[[Arrays], Arrays], shapes: list) -> Callable[[Arrays], Arrays]:
    return recording_as(run, shapes, "ids")


def test_a_row_s_length_ends_at_its_last_cell_that_is_not_padding() -> None:
    (one,) = padded_rows([3], 6)
    batch = {name: np.concatenate([one[name]] * 2) for name in one}
    batch["mask"][1, 4] = 1  # the mask alone says the second row is longer
    empty = {"ids": np.zeros((1, 6), np.int64), "mask": np.zeros((1, 6), np.float32)}
    pads = {"ids": 0.0, "mask": 0.0}
    assert Buckets(pads, Costs(1.0)).lengths(batch).tolist() == [3, 5]
    assert Buckets(pads, Costs(1.0)).lengths(empty).tolist() == [1]


@pytest.mark.parametrize(
    ("lengths", "costs", "runs"),
    [
        ([1, 1, 10, 10], Costs(1.0), [(0, 2), (2, 4)]),  # splitting saves 18 cells for one call
        ([1, 1, 10, 10], Costs(30.0), [(0, 4)]),  # a call costs more than the padding
        ([2, 3, 40], Costs(), [(0, 3)]),  # never split
        ([5], Costs(1.0), [(0, 1)]),
        ([30, 30, 31], Costs(5.0), [(0, 3)]),  # one cell of padding each: not worth a call
        # ... unless attention's square makes the 31st cell of a row cost 7 more
        ([30, 30, 31], Costs(5.0, square=0.1), [(0, 2), (2, 3)]),
    ],
)
def test_the_plan_splits_where_a_call_costs_less_than_the_padding_it_saves(
    lengths: list[int], costs: Costs, runs: list[tuple[int, int]]
) -> None:
    assert plan(np.array(lengths), costs) == runs


def test_the_costs_are_fitted_apart_from_a_row_s_own_cost() -> None:
    # t(rows, n) = call + rows * (own + cell * n + square * n**2), in ms
    call, own, cell, square = 2.0, 0.5, 0.25, 0.001

    def seconds(rows: int, n: int) -> float:
        return call + rows * (own + cell * n + square * n * n)

    costs = fit([seconds(1, n) for n in buckets._LENGTHS], seconds(buckets._ROWS, 1))
    assert costs.call == pytest.approx(call / cell)
    assert costs.square == pytest.approx(square / cell)


def test_a_length_that_costs_nothing_never_splits() -> None:
    assert math.isinf(fit([1.0, 1.0, 1.0], 2.0).call)


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
    outputs = Buckets({"ids": 0.0, "mask": 0.0}, Costs(1.0)).run(
        batch, recording(model.run, shapes)
    )
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
    costs = buckets.calibrate(model.signature, pads, model.run)
    assert costs.call >= 0 and costs.square >= 0


def test_requests_of_any_lengths_share_a_batch_that_is_cut(tmp_path: Path) -> None:
    """The padding cap (max_padding 0.5) would keep the 40-token request out of the three
    2-token ones' batch; where buckets cut the padding off, the plan decides the calls."""
    model = load(tmp_path, pooled_only())
    requests = tokens([2, 2, 2, 40], seed=3)

    async def go() -> list[Arrays]:
        return await asyncio.gather(*(model.infer(r, Request()) for r in requests))

    answers = asyncio.run(go())
    assert max(model.stats.batch_sizes) == len(requests)
    for request, answer in zip(requests, answers, strict=True):
        np.testing.assert_allclose(answer["pooled"], model.run(request)["pooled"], atol=1e-6)


@pytest.mark.skipif(not (MINILM / "1" / "model.onnx").is_file(), reason="make models-text")
def test_minilm_answers_a_mixed_flight_as_it_answers_each_sentence_alone() -> None:
    settings = InferenceSettings(models=["minilm"], workers=1)
    spec = read_spec(MINILM / "model.yaml", settings)
    model = load_version(MINILM / "1", "minilm", 1, spec, ThreadPoolExecutor(1), "t")
    tokenizer = Tokenizer.from_file(str(MINILM / "1" / "tokenizer.json"))
    tokenizer.no_padding()
    encoded = [tokenizer.encode(s) for s in SENTENCES]
    width = max(len(e.ids) for e in encoded)
    flight = {
        name: np.zeros((len(encoded), width), np.int64)
        for name in ("input_ids", "attention_mask", "token_type_ids")
    }
    for row, e in enumerate(encoded):
        flight["input_ids"][row, : len(e.ids)] = e.ids
        flight["attention_mask"][row, : len(e.ids)] = 1
    shapes: list = []
    model.run = recording_as(model.run, shapes, "input_ids")  # type: ignore[method-assign]
    (answer,) = model.run_requests([flight])
    assert 1 < len(shapes) < len(encoded)  # buckets, neither one call nor one a row
    for row, e in enumerate(encoded):
        n = len(e.ids)
        alone = model.run({name: values[row : row + 1, :n] for name, values in flight.items()})
        np.testing.assert_allclose(answer["embedding"][row], alone["embedding"][0], atol=1e-5)
