"""The pipe A/B runs both transports at each number in flight and reports each (never how
fast)."""

import pytest

from tests.support.benchrun import run_bench

pytestmark = pytest.mark.bench


def test_the_pipes_benchmark_reports_both_transports() -> None:
    out = run_bench("bench.pipes", "--messages", "40", "--rounds", "2", "--in-flight", "1,4")
    rows = [row.split("|")[1:3] for row in out.splitlines() if row.startswith("| ")]
    measured = {(transport.strip(), level.strip()) for transport, level in rows[1:]}
    assert measured == {(t, n) for t in ("grpc", "pipe") for n in ("1", "4")}
