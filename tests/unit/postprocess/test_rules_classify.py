"""Classification rules alone: softmax, sigmoid, threshold, sort, top-k, labels."""

from __future__ import annotations

import json
import re
import time
import warnings
from pathlib import Path

import grpc
import numpy as np
import pytest
import yaml

from services.postprocess.rules import RuleContext
from services.postprocess.rules import build_rule_options as build
from services.postprocess.rules.base import Misconfigured
from strata.errors import InvalidArgument
from strata.plugins import NotFinite

INF, NAN = np.inf, np.nan


def apply(kind: str, tensors: dict, base_dir: Path = Path("."), **options) -> dict:
    rule = build(kind, options, base_dir)
    return rule.apply(tensors, RuleContext(time.monotonic() + 10))


def f32(*rows: list) -> np.ndarray:
    return np.array(rows, np.float32)


# softmax and sigmoid


def test_softmax_rows_sum_to_one_and_keep_order() -> None:
    out = apply("softmax", {"x": f32([1, 2, 3], [1000, 1000, -1000])}, input="x", output="p")["p"]
    assert out.dtype == np.float32
    np.testing.assert_allclose(out.sum(axis=1), 1, rtol=1e-6)
    np.testing.assert_allclose(out[0], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), rtol=1e-6)
    np.testing.assert_allclose(out[1], [0.5, 0.5, 0], atol=1e-7)


def test_softmax_is_stable_at_finite_extremes_and_refuses_nan_and_infinities() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow or invalid-value warnings either
        out = apply("softmax", {"x": f32([3e38, 0, 3e38], [-3e38, -3e38, -3e38])}, input="x")
    x = out["x"]
    assert x[0].tolist() == [0.5, 0, 0.5]
    np.testing.assert_allclose(x[1], 1 / 3)
    for row in ([NAN, 0, 1], [INF, 0, 1], [-INF, 0, 1]):
        with pytest.raises(NotFinite, match="1 of the 3 values of 'x' are NaN or infinite"):
            apply("softmax", {"x": f32(row)}, input="x")


def test_softmax_accepts_integers_and_empty_batches_and_refuses_bytes() -> None:
    assert apply("softmax", {"x": np.array([[0, 0]], np.int64)}, input="x")["x"].tolist() == [
        [0.5, 0.5]
    ]
    assert apply("softmax", {"x": np.zeros((0, 4), np.float32)}, input="x")["x"].shape == (0, 4)
    with pytest.raises(InvalidArgument, match="softmax needs a numeric tensor 'x'"):
        apply("softmax", {"x": np.array([b"a"], dtype=object)}, input="x")
    with pytest.raises(InvalidArgument, match="softmax needs tensor 'x'"):
        apply("softmax", {"y": f32([1])}, input="x")
    for shape in [(0,), (3, 0), ()]:  # no class to share the probability: the caller's input
        with pytest.raises(InvalidArgument, match="at least one class"):
            apply("softmax", {"x": np.zeros(shape, np.float32)}, input="x")


def test_sigmoid_is_stable_at_the_extremes() -> None:
    values = f32([-1000, -1, 0, 1, 1000])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = apply("sigmoid", {"x": values}, input="x", output="p")["p"][0]
    np.testing.assert_allclose(out, [0, 1 / (1 + np.e), 0.5, 1 / (1 + np.exp(-1)), 1])
    assert out.dtype == np.float32
    with pytest.raises(NotFinite):
        apply("sigmoid", {"x": f32([0, NAN])}, input="x", output="p")


# threshold


def test_threshold_scalar_and_per_class() -> None:
    scores = f32([0.2, 0.5, 0.1], [0.9, 0.1, 0.7])
    out = apply("threshold", {"s": scores}, input="s", output="t", threshold=0.5)["t"]
    assert out.dtype == np.bool_ and out.tolist() == [[False, True, False], [True, False, True]]
    per = apply("threshold", {"s": scores}, input="s", output="t", threshold=[0.1, 0.5, 0.8])["t"]
    assert per.tolist() == [[True, True, False], [True, False, False]]


def test_threshold_per_class_must_fit_the_scores() -> None:
    with pytest.raises(Misconfigured, match="2 per-class values but 's' has shape"):
        apply("threshold", {"s": f32([0.1, 0.2, 0.3])}, input="s", output="t", threshold=[1, 2])
    with pytest.raises(ValueError, match=r"threshold.threshold.float\n  Input should be a valid"):
        build("threshold", {"input": "s", "output": "t", "threshold": "high"}, Path("."))


# sort and topk


def test_sort_descending_is_stable() -> None:
    scores = f32([0.1, 0.0, 0.5, 0.1])
    out = apply("sort", {"s": scores}, input="s", values="v", indices="i")
    assert out["i"].tolist() == [[2, 0, 3, 1]] and out["i"].dtype == np.int64
    assert out["v"][0].tolist() == pytest.approx([0.5, 0.1, 0.1, 0.0])
    up = apply("sort", {"s": scores}, input="s", indices="i", descending=False)
    assert up["i"].tolist() == [[1, 0, 3, 2]] and "v" not in up


def test_topk_best_first_and_k_above_the_class_count() -> None:
    scores = f32([0.1, 0.7, 0.2], [0.5, 0.3, 0.2])
    out = apply("topk", {"s": scores}, input="s", k=2, values="v", indices="i")
    assert out["i"].tolist() == [[1, 2], [0, 1]]
    np.testing.assert_allclose(out["v"], [[0.7, 0.2], [0.5, 0.3]])
    wide = apply("topk", {"s": scores}, input="s", k=10, values="v", indices="i")
    assert wide["i"].shape == (2, 3)
    empty = apply(
        "topk", {"s": np.zeros((0, 3), np.float32)}, input="s", k=2, values="v", indices="i"
    )
    assert empty["i"].shape == (0, 2)


@pytest.mark.parametrize("shape", [(16, 40), (3, 4, 40)])
@pytest.mark.parametrize("ties", [False, True])
def test_topk_over_several_rows_is_the_sorts_first_k(shape: tuple[int, ...], ties: bool) -> None:
    rng = np.random.default_rng(3)
    # Few distinct scores make ties across the k-th place, which the lower index wins.
    scores = rng.integers(0, 4, shape) if ties else rng.normal(size=shape)
    tensors = {"s": scores.astype(np.float32)}
    ordered = apply("sort", tensors, input="s", values="v", indices="i")
    for k in (1, 5, 39):
        top = apply("topk", tensors, input="s", k=k, values="v", indices="i")
        assert top["i"].tolist() == ordered["i"][..., :k].tolist()
        assert top["v"].tolist() == ordered["v"][..., :k].tolist()


@pytest.mark.parametrize(
    ("k", "words"),
    [(0, "greater than 0"), (-1, "greater than 0"), (1.5, "a valid int"), (True, "a valid int")],
)
def test_topk_refuses_bad_k(k, words: str) -> None:
    with pytest.raises(ValueError, match=f"topk.k\n  Input should be {words}"):
        build("topk", {"input": "s", "k": k, "values": "v", "indices": "i"}, Path("."))


# labels


def test_inline_labels_keep_the_shape() -> None:
    out = apply(
        "labels", {"c": np.array([[2, 0], [1, 1]])}, input="c", output="l", labels=["a", "b", "é"]
    )
    assert out["l"].tolist() == [[b"\xc3\xa9", b"a"], [b"b", b"b"]]
    empty = apply("labels", {"c": np.zeros((0, 3), np.int64)}, input="c", output="l", labels=["a"])
    assert empty["l"].shape == (0, 3)


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("labels.txt", "cat\ndog\nbird\n"),
        ("labels.json", json.dumps(["cat", "dog", "bird"])),
        ("model.yaml", yaml.safe_dump({"platform": "onnx", "labels": ["cat", "dog", "bird"]})),
    ],
)
def test_labels_from_a_file_beside_the_model(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / name).write_text(body)
    out = apply("labels", {"c": np.array([2, 0])}, tmp_path, input="c", output="l", file=name)
    assert out["l"].tolist() == [b"bird", b"cat"]


def test_a_labels_file_shorter_than_the_outputs_is_refused_at_start_up(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    options = {"input": "c", "output": "l", "file": "labels.txt", "classes": 3}
    with pytest.raises(
        ValueError,
        match=re.escape("'labels.txt' has 2 labels, fewer than the 3 classes the rule's `classes`"),
    ):
        build("labels", options, tmp_path)


def test_a_short_labels_file_unchecked_gives_a_clear_error_per_request(tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("cat\ndog\n")
    rule = build("labels", {"input": "c", "output": "l", "file": "labels.txt"}, tmp_path)
    context = RuleContext(time.monotonic() + 10)
    with pytest.raises(Misconfigured) as info:
        rule.apply({"c": np.array([[0, 2]])}, context)
    assert info.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert "class index 2 has no label: labels file 'labels.txt' has 2 labels" in str(info.value)
    with pytest.raises(Misconfigured, match="class index"):
        rule.apply({"c": np.array([-1])}, context)
    with pytest.raises(Misconfigured, match="needs integer class indices"):
        rule.apply({"c": np.array([0.0])}, context)


@pytest.mark.parametrize(
    ("options", "body", "words"),
    [
        ({"labels": ["a"], "file": "l.txt"}, "a\n", "either 'labels'"),
        ({}, "a\n", "either 'labels'"),
        ({"labels": []}, "", "labels.labels\n  List should have at least 1 item"),
        ({"labels": ["a", ""]}, "", "labels.labels.1\n  String should have at least 1"),
        ({"file": "l.txt"}, "a\n\nb\n", "entry 1 is empty"),
        ({"file": "l.txt"}, "", "non-empty list of strings"),
        ({"file": "missing.txt"}, "", "not found"),
        ({"file": "l.csv"}, "", "not found"),
        ({"labels": ["a"], "classes": "ten"}, "", "labels.classes\n  Input should be a valid"),
        ({"file": "l.yaml"}, "", "not found"),
    ],
)
def test_labels_config_mistakes(tmp_path: Path, options: dict, body: str, words: str) -> None:
    (tmp_path / "l.txt").write_text(body)
    with pytest.raises(ValueError, match=words):
        build("labels", {"input": "c", "output": "l", **options}, tmp_path)


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("model.yaml", "labels: [a, b", "is not valid YAML"),
        ("model.yaml", "platform: onnx\n", "mapping with 'labels'"),
        ("labels.json", "{}", "non-empty list of strings"),
        ("labels.json", "[1, 2]", "non-empty list of strings"),
    ],
)
def test_labels_file_mistakes(tmp_path: Path, name: str, body: str, words: str) -> None:
    (tmp_path / name).write_text(body)
    with pytest.raises(ValueError, match=words):
        build("labels", {"input": "c", "output": "l", "file": name}, tmp_path)


def test_labels_refuse_a_model_with_more_classes_than_labels() -> None:
    tensors = {"logits": np.zeros((1, 11), np.float32), "classes": np.array([[3]], np.int64)}
    options = {"input": "classes", "output": "labels", "labels": [str(i) for i in range(10)]}
    assert apply("labels", tensors, **options)["labels"].tolist() == [[b"3"]]
    with pytest.raises(Misconfigured, match="'logits' has 11 classes but the inline labels has 10"):
        apply("labels", tensors, **options, classes_of="logits")
