"""Compute normalisation statistics from a data file and write the stats file.

    python -m services.preprocess.fit_stats --data train.npy --out repository/m/1/stats.json

The data is [rows, features]: a .npy array, one array of an .npz (--key when it has several),
or a .csv of numbers (a first row that is not numeric is taken as a header). The file gets the
fingerprint that the `standardize` step checks against the model's `preprocess_fingerprint`.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from strata.models.normalisation import fit_stats, save_stats


def load_data(path: Path, key: str | None = None) -> np.ndarray:
    """The [rows, features] array in `path`; ValueError says what is wrong with it."""
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix == ".npy":
        array: np.ndarray = np.load(path, allow_pickle=False)
        return array
    if path.suffix == ".npz":
        return _from_npz(path, key)
    if path.suffix == ".csv":
        return _from_csv(path)
    raise ValueError(f"{path}: use a .npy, .npz or .csv file")


def _from_npz(path: Path, key: str | None) -> np.ndarray:
    with np.load(path, allow_pickle=False) as archive:
        names = list(archive.files)
        if key is None:
            if len(names) != 1:
                raise ValueError(f"{path} holds {names}; choose one with --key")
            key = names[0]
        if key not in names:
            raise ValueError(f"{path} has no array {key!r} (it has {names})")
        array: np.ndarray = archive[key]
        return array


def _from_csv(path: Path) -> np.ndarray:
    with path.open(newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    if rows and not _numeric(rows[0]):
        rows = rows[1:]
    widths = {len(row) for row in rows}
    if len(widths) > 1:
        raise ValueError(f"{path}: rows have different numbers of columns {sorted(widths)}")
    try:
        return np.array([[float(cell) for cell in row] for row in rows], dtype=np.float64)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _numeric(row: list[str]) -> bool:
    try:
        [float(cell) for cell in row]
    except ValueError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.preprocess.fit_stats", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--data", type=Path, required=True, help=".npy, .npz or .csv file")
    parser.add_argument("--out", type=Path, required=True, help="stats file to write (JSON)")
    parser.add_argument("--key", help="the array to use from an .npz with several")
    args = parser.parse_args(argv)
    try:
        stats = fit_stats(load_data(args.data, args.key))
    except (ValueError, OSError) as exc:  # numpy reports unreadable files as either
        print(f"fit-stats: {exc}", file=sys.stderr)
        return 2
    save_stats(stats, args.out)
    print(f"wrote {args.out}: {stats.mean.shape[0]} features, fingerprint {stats.fingerprint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
