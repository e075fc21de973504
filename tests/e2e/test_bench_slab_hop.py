"""The slab A/B runs both hops both ways and reports each (never how fast)."""

import pytest

from tests.support.benchrun import run_bench

pytestmark = pytest.mark.bench


def test_the_slab_hop_benchmark_reports_both_hops_both_ways() -> None:
    out = run_bench("bench.slab_hop", "--photos", "1", "--rounds", "1", "--calls", "4")
    for hop in ("preprocess", "inference-a"):
        (line,) = [row for row in out.splitlines() if row.strip().startswith(f"{hop}:")]
        assert "bytes caller" in line and "slab layer" in line
