"""The slab A/B runs both hops both ways and reports each (never how fast)."""

import subprocess
import sys

import pytest

from strata.tools.launch import ROOT

pytestmark = pytest.mark.bench


def test_the_slab_hop_benchmark_reports_both_hops_both_ways() -> None:
    command = ["-m", "bench.slab_hop", "--photos", "1", "--rounds", "1", "--calls", "4"]
    done = subprocess.run(
        [sys.executable, *command], cwd=ROOT, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for hop in ("preprocess", "inference-a"):
        (line,) = [row for row in done.stdout.splitlines() if row.strip().startswith(f"{hop}:")]
        assert "bytes caller" in line and "slab layer" in line
