"""The fit-stats command: data files in, a fingerprinted stats file out, mistakes explained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from services.preprocess.fit_stats import main
from services.preprocess.steps import build_step
from strata.config.preprocess import StandardizeStep
from strata.models.normalisation import fit_stats, load_stats
from tests.support.system import ROOT

DATA = np.array([[1.0, 10.0, 5.0], [3.0, 30.0, 5.0], [5.0, 20.0, 5.0]])


def fit(tmp_path: Path, *args: str) -> int:
    return main([*args, "--out", str(tmp_path / "stats.json")])


def test_npy_gives_column_statistics(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    np.save(tmp_path / "train.npy", DATA)
    assert fit(tmp_path, "--data", str(tmp_path / "train.npy")) == 0
    stats = load_stats(tmp_path / "stats.json")
    np.testing.assert_allclose(stats.mean, [3, 20, 5])
    np.testing.assert_allclose(stats.std, [np.sqrt(8 / 3), np.sqrt(200 / 3), 1])  # constant: 1
    assert f"3 features, fingerprint {stats.fingerprint}" in capsys.readouterr().out


def test_the_written_file_feeds_standardize_with_its_fingerprint(tmp_path: Path) -> None:
    np.save(tmp_path / "train.npy", DATA.astype(np.float32))
    assert fit(tmp_path, "--data", str(tmp_path / "train.npy")) == 0
    fingerprint = load_stats(tmp_path / "stats.json").fingerprint
    spec = StandardizeStep(
        kind="standardize", input="x", stats="stats.json", fingerprint=fingerprint
    )
    step = build_step(spec, tmp_path)
    out = step.process({"x": DATA.astype(np.float32)})["x"]
    np.testing.assert_allclose(out.mean(axis=0), 0, atol=1e-6)


def test_float32_and_float64_copies_agree() -> None:
    assert fit_stats(DATA).fingerprint == fit_stats(DATA.astype(np.float32)).fingerprint


def test_npz_needs_a_key_when_it_holds_several(tmp_path: Path, capsys) -> None:
    np.savez(tmp_path / "d.npz", train=DATA, labels=np.arange(3))
    assert fit(tmp_path, "--data", str(tmp_path / "d.npz")) == 2
    assert "choose one with --key" in capsys.readouterr().err
    assert fit(tmp_path, "--data", str(tmp_path / "d.npz"), "--key", "nope") == 2
    assert "has no array 'nope'" in capsys.readouterr().err
    assert fit(tmp_path, "--data", str(tmp_path / "d.npz"), "--key", "train") == 0
    np.testing.assert_allclose(load_stats(tmp_path / "stats.json").mean, [3, 20, 5])


@pytest.mark.parametrize("header", ["", "a,b,c\n"])
def test_csv_with_or_without_a_header(tmp_path: Path, header: str) -> None:
    rows = "\n".join(",".join(str(v) for v in row) for row in DATA)
    (tmp_path / "d.csv").write_text(header + rows + "\n")
    assert fit(tmp_path, "--data", str(tmp_path / "d.csv")) == 0
    np.testing.assert_allclose(load_stats(tmp_path / "stats.json").mean, [3, 20, 5])


@pytest.mark.parametrize(
    ("name", "write", "words"),
    [
        (
            "d.npy",
            lambda p: np.save(p, np.array([[1.0, np.nan]])),
            "NaN or infinity (row 0, column 1)",
        ),
        ("d.npy", lambda p: np.save(p, np.array([[np.inf]])), "NaN or infinity"),
        ("d.npy", lambda p: np.save(p, np.arange(4.0)), "must be [rows, features]"),
        ("d.npy", lambda p: np.save(p, np.zeros((0, 3))), "must be [rows, features]"),
        ("d.npy", lambda p: p.write_bytes(b"not numpy"), "fit-stats:"),
        ("d.csv", lambda p: p.write_text("1,2\n3\n"), "different numbers of columns"),
        ("d.csv", lambda p: p.write_text("1,2\n3,x\n"), "could not convert"),
        ("d.txt", lambda p: p.write_text("1,2\n"), "use a .npy, .npz or .csv"),
    ],
)
def test_bad_data_is_refused_with_a_reason(tmp_path: Path, capsys, name, write, words) -> None:
    write(tmp_path / name)
    assert fit(tmp_path, "--data", str(tmp_path / name)) == 2
    assert words in capsys.readouterr().err
    assert not (tmp_path / "stats.json").exists()


@pytest.mark.slow  # two Python processes
def test_runs_as_a_module(tmp_path: Path) -> None:
    np.save(tmp_path / "train.npy", DATA)
    out = tmp_path / "deep" / "stats.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.preprocess.fit_stats",
            "--data",
            str(tmp_path / "train.npy"),
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert load_stats(out).mean.shape == (3,)
    missing = subprocess.run(
        [
            sys.executable,
            "-m",
            "services.preprocess.fit_stats",
            "--data",
            "nope.npy",
            "--out",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2 and "no such file" in missing.stderr
