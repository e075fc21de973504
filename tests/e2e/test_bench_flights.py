"""The flights benchmark's smoke mode: both systems measured, the results written.

Nothing here asserts speed: the machine is shared, so only the shape of the results counts.
"""

import json

import pytest

from tests.support.bench import run_quick

pytestmark = pytest.mark.bench


def test_the_quick_run_measures_both_sides_of_every_pipeline(tmp_path) -> None:
    run_quick("bench.flights", tmp_path)
    report = json.loads((tmp_path / "flights.json").read_text())
    assert set(report["pipelines"]) == {"digits", "tabular"}
    assert "cores" in report["machine"]
    for measured in report["pipelines"].values():
        for side in ("capacity_on", "capacity_off", "light_on", "light_off"):
            assert measured[side]["count"] > 0 and measured[side]["errors"] == {}, side
        assert measured["capacity_ratio"] > 0
    table = (tmp_path / "flights.md").read_text()
    assert "| digits |" in table and "| tabular |" in table
