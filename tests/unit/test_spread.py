"""tests/support/spread.py: the units pytest-xdist hands its workers, and their order."""

from __future__ import annotations

from tests.support.spread import unit, unit_weights, weight


def test_a_module_is_a_unit_and_a_package_sharing_fixtures_is_one() -> None:
    assert unit("tests/e2e/test_rest.py::test_a[x]") == "tests/e2e/test_rest.py"
    assert unit("tests/e2e/test_rest.py::TestA::test_b") == "tests/e2e/test_rest.py"
    assert unit("tests/hostile/test_v2.py::test_a") == unit("tests/hostile/test_flights.py::t")
    assert unit("tests/hostile/test_v2.py::test_a") == "tests/hostile"
    assert unit("tests/fuzz/test_fuzz_rest.py::t") == unit("tests/fuzz/test_fuzz_gateway.py::t")
    shared = "tests/e2e/default_system"
    assert unit(f"{shared}/test_chain.py::test_a") == unit(f"{shared}/test_stages.py::t") == shared


def test_slow_units_go_first_then_those_that_start_systems_then_services_then_the_rest() -> None:
    order = [
        "tests/unit/test_codec.py::test_a",
        "tests/service/test_servicers.py::test_a",
        "tests/fuzz/test_fuzz_rest.py::test_a",
        "tests/hostile/test_v2.py::test_a",
        "tests/e2e/default_system/test_chain.py::test_a",
        "tests/e2e/test_rest.py::test_a",
    ]
    assert [weight(nodeid) for nodeid in order] == [4, 3, 1, 1, 1, 2]
    assert weight("tests/test_top.py::test_a") == 4
    assert weight("tests/unit/models/test_models.py::test_a", slow=True) == 0


def test_a_unit_weighs_what_its_heaviest_test_does() -> None:
    tests = [
        ("tests/unit/models/test_models.py::test_a", False),
        ("tests/unit/models/test_models.py::test_b", True),
        ("tests/unit/test_codec.py::test_a", False),
    ]
    assert unit_weights(tests) == {
        "tests/unit/models/test_models.py": 0,
        "tests/unit/test_codec.py": 4,
    }
