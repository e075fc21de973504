"""The overload benchmark runs and reports every step (never how fast they were), directly and
through a front it fits past the capacity it found."""

import re
from pathlib import Path

import pytest

from bench.front import haproxy
from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_overload_sweep_runs_and_reports_each_step(tmp_path: Path) -> None:
    out = run_quick("bench.overload", tmp_path)
    assert "every call's deadline: 1 s, capacity search and open loop alike" in out
    assert "as configured: capacity (the best of (16, 64) in flight, full answers within" in out
    assert "full answers however late, the measure before:" in out
    assert "every process stayed up" in out
    table = (tmp_path / "overload.md").read_text()
    assert "every call's deadline: 1 s" in table
    assert "the load tool sends through" in out and "the load tool sends through" in table
    assert all(f"| {label} |" in table for label in ("0.8x", "2x", "4x"))
    columns = ("admin port", "refusal P99 ms", "degraded", "of own capacity", "load tool's cores")
    assert all(f"| {column} |" in table for column in columns)
    assert all(f"| {n} | 2x | as configured |" in table for n in (2, 8))
    assert "(admin port " in out


@pytest.mark.skipif(haproxy() is None, reason="haproxy is not installed")
def test_the_sweep_through_the_front_fits_the_front_and_reports_its_times(tmp_path: Path) -> None:
    out = run_quick("bench.overload", tmp_path, 300, "--front", "--connections", "2")
    assert re.search(r"the front at \d+ places, 2x capacity: the gateway cleared \d+/s", out), out
    # Then fewer places, while they clear the gateway's rate.
    assert re.search(r"the front at \d+ places: the gateway cleared \d+/s \(", out), out
    fitted = re.search(r"STRATA_FRONT_MAXCONN=(\d+) STRATA_FRONT_QUEUE_MS=12 ", out)
    assert fitted, out
    sizing = fitted.group(1)
    table = (tmp_path / "overload.md").read_text()
    rows = [row for row in table.splitlines() if row.startswith("|")]
    fronted = [row for row in rows if f"behind the front ({sizing} places" in row]
    assert len(fronted) == 3, table
    # The front's own capacity, searched through it, for its steps' share of it.
    assert re.search(rf"behind the front \({sizing} places[^)]*\): capacity \(the best", out)
    # Its last two columns: HAProxy's average times, queued and in the gateway, both measured.
    assert all(re.search(r"\| \d+ \| \d+ \|$", row) for row in fronted), fronted
    assert "every process stayed up" in out
