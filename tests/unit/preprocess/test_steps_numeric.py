"""Numeric and lookup steps alone: clip, cast, scale, flatten, standardize, vocabulary."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from services.preprocess.steps import StepError
from services.preprocess.steps import build_step_options as build
from strata.errors import InvalidArgument
from strata.models.normalisation import Stats, save_stats

INF, NAN = np.inf, np.nan


def run(kind: str, tensors: dict, base_dir: Path = Path("."), **options) -> dict:
    return build(kind, {"input": "x", **options}, base_dir).process(tensors)


# clip


def test_clip_floats_sends_infinities_to_the_bounds() -> None:
    values = np.array([[-INF, -2.0, 0.5, 3.0, INF]], np.float32)
    out = run("clip", {"x": values}, low=-1, high=1)["x"]
    assert out.dtype == np.float32 and out.tolist() == [[-1, -1, 0.5, 1, 1]]
    assert run("clip", {"x": values}, low=0)["x"].tolist() == [[0, 0, 0.5, 3, INF]]


def test_clip_refuses_nan_unless_told_what_to_put_there() -> None:
    values = np.array([1.0, NAN], np.float64)
    with pytest.raises(StepError, match="input 'x': contains NaN"):
        run("clip", {"x": values}, low=0, high=1)
    out = run("clip", {"x": values}, low=0, high=1, nan=0.25)["x"]
    assert out.tolist() == [1.0, 0.25] and values[1] != values[1]  # the input is untouched


def test_clip_integers_keeps_their_type() -> None:
    values = np.array([0, 100, 255], np.uint8)
    out = run("clip", {"x": values}, low=10.5, high=300)["x"]
    assert out.dtype == np.uint8 and out.tolist() == [11, 100, 255]


def test_clip_empty_batch_and_bad_input() -> None:
    assert run("clip", {"x": np.zeros((0, 3), np.float32)}, high=1)["x"].shape == (0, 3)
    with pytest.raises(StepError, match="clip needs numbers"):
        run("clip", {"x": np.array([b"a"], dtype=object)}, high=1)
    with pytest.raises(InvalidArgument, match="needs tensor 'x'"):
        run("clip", {"y": np.zeros(1)}, high=1)


@pytest.mark.parametrize(
    ("options", "words"),
    [({}, "needs 'low', 'high'"), ({"low": 2, "high": 1}, "is above"), ({"low": "a"}, "number")],
)
def test_clip_config_mistakes(options: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        build("clip", {"input": "x", **options}, Path("."))


# cast


@pytest.mark.parametrize(
    ("values", "datatype", "options", "expected"),
    [
        (np.array([1.9, -1.9]), "INT32", {}, [1, -1]),
        (np.array([1.5, 2.5, -0.6]), "INT64", {"round": True}, [2, 2, -1]),
        (np.array([0, 3], np.int64), "FP16", {}, [0.0, 3.0]),
        (np.array([0.0, 2.0]), "BOOL", {}, [False, True]),
        (np.array([255.9]), "UINT8", {}, [255]),
        (np.array([True, False]), "INT8", {}, [1, 0]),
    ],
)
def test_cast(values: np.ndarray, datatype: str, options: dict, expected: list) -> None:
    out = run("cast", {"x": values}, datatype=datatype, output="y", **options)
    assert "x" not in out and out["y"].tolist() == expected
    assert (
        out["y"].dtype.str[1:]
        == np.dtype(
            {"INT32": "i4", "INT64": "i8", "FP16": "f2", "BOOL": "?", "UINT8": "u1", "INT8": "i1"}[
                datatype
            ]
        ).str[1:]
    )


@pytest.mark.parametrize(
    ("values", "datatype", "words"),
    [
        (np.array([1.0, NAN]), "INT32", "NaN or infinity"),
        (np.array([INF]), "INT64", "NaN or infinity"),
        (np.array([256.0]), "UINT8", "outside 0..255"),
        (np.array([-1], np.int64), "UINT64", "outside 0"),
        (np.array([2.0**63]), "INT64", "outside"),
        (np.array([70000.0]), "FP16", "too large for FP16"),
        (np.array([1e300]), "FP32", "too large for FP32"),
        (np.array([b"1"], dtype=object), "INT32", "cast needs numbers"),
    ],
)
def test_cast_refuses_values_the_type_cannot_hold(
    values: np.ndarray, datatype: str, words: str
) -> None:
    with pytest.raises(StepError, match=words):
        run("cast", {"x": values}, datatype=datatype)


def test_cast_keeps_infinities_between_float_types_and_refuses_bytes_target() -> None:
    out = run("cast", {"x": np.array([INF, NAN])}, datatype="FP32")["x"]
    assert out.dtype == np.float32 and out[0] == INF and np.isnan(out[1])
    with pytest.raises(ValueError, match=r"cast.datatype\n  Input should be 'BOOL', 'UINT8'"):
        build("cast", {"input": "x", "datatype": "BYTES"}, Path("."))


# scale, flatten


def test_scale_and_flatten() -> None:
    scaled = run("scale", {"x": np.array([[0, 255]], np.uint8)}, factor=1 / 255, offset=-0.5)["x"]
    assert scaled.dtype == np.float32 and np.allclose(scaled, [[-0.5, 0.5]])
    flat = run("flatten", {"x": np.zeros((3, 2, 4))}, output="f")
    assert set(flat) == {"f"} and flat["f"].shape == (3, 8)
    assert run("flatten", {"x": np.zeros((0, 2, 4))})["x"].shape == (0, 8)


# standardize


@pytest.fixture()
def stats_dir(tmp_path: Path) -> Path:
    save_stats(
        Stats(np.array([1, 2], np.float32), np.array([2, 4], np.float32)), tmp_path / "s.json"
    )
    return tmp_path


def test_standardize_uses_the_loaded_statistics(stats_dir: Path) -> None:
    out = run(
        "standardize", {"x": np.array([[3, 6], [1, 2]], np.float32)}, stats_dir, stats="s.json"
    )
    assert out["x"].tolist() == [[1, 1], [0, 0]]
    with pytest.raises(StepError, match=r"expected \[batch, 2\] features, got shape \[1, 3\]"):
        run("standardize", {"x": np.zeros((1, 3), np.float32)}, stats_dir, stats="s.json")


def test_finite_values_too_large_to_standardise_are_refused_not_made_infinite(
    tmp_path: Path,
) -> None:
    tight = Stats(np.array([0, 0], np.float32), np.array([1, 0.5], np.float32))
    save_stats(tight, tmp_path / "tight.json")
    step = build("standardize", {"input": "x", "stats": "tight.json"}, tmp_path)
    huge = np.array([[1.0, 2.0], [1.0, 3.4e38]], np.float32)
    with pytest.raises(StepError, match=r"row 1 feature 1 .* not a finite FP32 number"):
        step.process({"x": huge})
    assert step.process({"x": huge[:1]})["x"].tolist() == [[1.0, 4.0]]


def test_standardize_refuses_a_fingerprint_mismatch_and_edited_files(stats_dir: Path) -> None:
    with pytest.raises(ValueError, match="but the model was built with sha256:0000"):
        build(
            "standardize",
            {"input": "x", "stats": "s.json", "fingerprint": "sha256:0000"},
            stats_dir,
        )
    body = json.loads((stats_dir / "s.json").read_text())
    body["mean"][0] = 5
    (stats_dir / "s.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match="fingerprint does not match"):
        build("standardize", {"input": "x", "stats": "s.json"}, stats_dir)


# vocabulary


def strings(*items: bytes) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = list(items)
    return out


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("v.txt", "red\ngreen\nblue\n"),
        ("v.json", json.dumps(["red", "green", "blue"])),
        ("v.json", json.dumps({"blue": 2, "red": 0, "green": 1})),
    ],
)
def test_vocabulary_lookup_from_each_file_format(tmp_path: Path, name: str, body: str) -> None:
    (tmp_path / name).write_text(body)
    values = strings(b"blue", b"red", b"green", b"red").reshape(2, 2)
    out = run("vocabulary", {"x": values}, tmp_path, vocabulary=name, output="ids")
    assert out["ids"].dtype == np.int64 and out["ids"].tolist() == [[2, 0], [1, 0]]


def test_vocabulary_out_of_vocabulary(tmp_path: Path) -> None:
    (tmp_path / "v.txt").write_text("red\ngreen\n")
    values = strings(b"red", b"purple", b"", b"\xff")
    out = run("vocabulary", {"x": values}, tmp_path, vocabulary="v.txt", oov_id=99)
    assert out["x"].tolist() == [0, 99, 99, 99]
    with pytest.raises(StepError, match=r"element 1 \(b'purple'\) is not in the vocabulary"):
        run("vocabulary", {"x": values}, tmp_path, vocabulary="v.txt")
    empty = run("vocabulary", {"x": strings()}, tmp_path, vocabulary="v.txt")
    assert empty["x"].shape == (0,)
    with pytest.raises(StepError, match="needs BYTES"):
        run("vocabulary", {"x": np.zeros(2)}, tmp_path, vocabulary="v.txt")


@pytest.mark.parametrize(
    ("name", "body", "words"),
    [
        ("v.txt", "", "is empty"),
        ("v.txt", "a\nb\na\n", "'a' appears more than once"),
        ("v.json", json.dumps({"a": 0, "b": 0}), "share an id"),
        ("v.json", json.dumps({"a": -1}), "negative id"),
        ("v.json", json.dumps({"a": "1"}), "is not text -> id"),
        ("v.json", json.dumps("abc"), "JSON list or object"),
    ],
)
def test_vocabulary_file_mistakes(tmp_path: Path, name: str, body: str, words: str) -> None:
    (tmp_path / name).write_text(body)
    with pytest.raises(ValueError, match=words):
        build("vocabulary", {"input": "x", "vocabulary": name}, tmp_path)


def test_vocabulary_missing_file_and_bad_oov(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=re.escape("'v.txt' not found")):
        build("vocabulary", {"input": "x", "vocabulary": "v.txt"}, tmp_path)
    (tmp_path / "v.txt").write_text("a\n")
    with pytest.raises(ValueError, match=r"vocabulary.oov_id\n  Input should be a valid integer"):
        build("vocabulary", {"input": "x", "vocabulary": "v.txt", "oov_id": "x"}, tmp_path)
