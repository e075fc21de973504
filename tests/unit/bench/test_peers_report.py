"""The peer benchmark's report: degraded answers are counted beside the errors and never
pass as full answers, in the table or in the ratios."""

from pathlib import Path

import pytest

from bench.measure import Point
from bench.peers import images, report
from bench.peers.rows import QUICK, Row


def row(server: str, concurrency: int, throughput: float, degraded: int) -> Row:
    point = Point(
        label=f"c={concurrency}",
        loop="closed",
        offered=None,
        concurrency=concurrency,
        count=int(throughput * 2),
        seconds=2.0,
        throughput=throughput,
        goodput=throughput - degraded / 2,
        p50_ms=5.0,
        p95_ms=8.0,
        p99_ms=9.0,
        errors={},
        degraded=degraded,
        cached=degraded,
    )
    return Row(server, server.title(), "digits", concurrency, point, {"gateway": 1.0})


def test_degraded_answers_are_counted_and_never_pass_as_full() -> None:
    # The pipeline answers 500/s at c=8, 400 of its 1,000 answers from the cache: 300 full/s.
    rows = [
        row("pipeline", 1, 100.0, 0),
        row("pipeline", 8, 500.0, 400),
        row("mlserver", 1, 100.0, 0),
        row("mlserver", 8, 400.0, 0),
    ]
    result = report.build(rows, {}, Path("configs/default.yaml"), QUICK, 10.0)
    at_8 = result["servers"]["pipeline"]["rows"][1]
    assert at_8["degraded"] == 400
    assert at_8["full_throughput"] == pytest.approx(300.0)
    assert result["ratios"]["throughput_pipeline_over_mlserver"] == pytest.approx(0.75)
    table = report.markdown(result)
    assert "| Pipeline | digits | 8 | 300 | 5.00 | 9.00 | 1.00 | 400 | - |" in table
    assert "| Mlserver | digits | 8 | 400 | 5.00 | 9.00 | 1.00 | 0 | - |" in table


def test_the_image_and_text_table_shows_full_answers_and_degraded_beside_errors() -> None:
    rows = [row("strata", 1, 100.0, 0), row("strata", 64, 500.0, 400)]
    loop = {"processes": 2, "p50_ms": 4.0, "p99_ms": 6.0, "per_second": 250.0, "cpu_ms": 8.0}
    table = images.markdown("images", rows, [loop], {})
    assert "| server | c=1 P50 / P99 ms | c=1 full answers/s | c=64 full answers/s " in table
    assert "| Strata | 5.0 / 9.0 | 100.0 | 300.0 | 1.0 / 1.0 | 0 / 0 | 0 / 400 |" in table
