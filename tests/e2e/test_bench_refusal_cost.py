"""bench.refusal_cost in a short run: each way of answering ends its calls with the status it
names (grpc.aio's own limiter refuses every call while one holds its only place), and each
reports the CPU its server spent per call."""

import subprocess
import sys

import pytest

pytestmark = pytest.mark.bench
ENDED = {
    "answer": "OK 100",
    "abort": "RESOURCE_EXHAUSTED 100",
    "set_code": "RESOURCE_EXHAUSTED 100",
    "limiter": "RESOURCE_EXHAUSTED 100",
    "unimplemented": "UNIMPLEMENTED 100",
}


def test_each_way_ends_its_calls_as_it_says_and_reports_its_cpu() -> None:
    command = [sys.executable, "-m", "bench.refusal_cost", "--calls", "100", "--rounds", "1"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    rows = {
        cells[0]: cells[1:]
        for line in done.stdout.splitlines()
        if (cells := [cell.strip() for cell in line.strip("|").split("|")])[0] in ENDED
    }
    assert set(rows) == set(ENDED)
    for way, (micros, codes) in rows.items():
        assert codes == ENDED[way]
        assert float(micros) >= 0
