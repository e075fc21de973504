"""Embedding rules alone: mean pooling with an attention mask, and L2 normalisation."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from services.postprocess.rules import RuleContext
from services.postprocess.rules import build_rule_options as build
from strata.errors import InvalidArgument

TOKENS = np.random.default_rng(3).normal(size=(3, 4, 5)).astype(np.float32)
MASK = np.array([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.int64)


def apply(kind: str, tensors: dict, **options) -> dict:
    rule = build(kind, options, Path("."))
    return rule.apply(tensors, RuleContext(time.monotonic() + 10))


def test_mean_pool_ignores_padding_and_pools_an_empty_row_to_zeros() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = apply(
            "mean_pool", {"tok": TOKENS, "mask": MASK}, input="tok", mask="mask", output="emb"
        )["emb"]
    assert out.shape == (3, 5) and out.dtype == np.float32
    np.testing.assert_allclose(out[0], TOKENS[0, :2].mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(out[1], TOKENS[1].mean(axis=0), rtol=1e-6)
    np.testing.assert_array_equal(out[2], 0)


def test_mean_pool_normalised_gives_unit_vectors_and_no_mask_means_every_token() -> None:
    out = apply("mean_pool", {"tok": TOKENS, "m": MASK}, input="tok", mask="m", normalize=True)
    norms = np.linalg.norm(out["tok"], axis=1)
    np.testing.assert_allclose(norms[:2], 1, rtol=1e-6)
    assert norms[2] == 0
    plain = apply("mean_pool", {"tok": TOKENS}, input="tok", output="e")["e"]
    np.testing.assert_allclose(plain, TOKENS.mean(axis=1), rtol=1e-6)


def test_mean_pool_empty_batch_and_shape_mistakes() -> None:
    empty = apply(
        "mean_pool", {"t": np.zeros((0, 4, 5)), "m": np.zeros((0, 4))}, input="t", mask="m"
    )
    assert empty["t"].shape == (0, 5)
    with pytest.raises(InvalidArgument, match=r"mask 'm' has shape \[3, 3\], expected \[3, 4\]"):
        apply("mean_pool", {"t": TOKENS, "m": MASK[:, :3]}, input="t", mask="m")
    with pytest.raises(InvalidArgument, match=r"\[batch, tokens, dim\]"):
        apply("mean_pool", {"t": TOKENS[0]}, input="t")
    with pytest.raises(InvalidArgument, match="needs tensor 'm'"):
        apply("mean_pool", {"t": TOKENS}, input="t", mask="m")


def test_l2_normalize_keeps_zero_vectors_zero() -> None:
    vectors = np.array([[3, 4], [0, 0]], np.float32)
    out = apply("l2_normalize", {"v": vectors}, input="v", output="n")
    np.testing.assert_allclose(out["n"], [[0.6, 0.8], [0, 0]], rtol=1e-6)
    assert out["v"].tolist() == [[3, 4], [0, 0]]  # the input array is untouched
