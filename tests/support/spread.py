"""The units of work pytest-xdist hands its workers (tests/conftest.py wires this in).

A unit is a test module, so a module-scoped system starts once, on one worker; a package
whose fixtures are package-scoped (tests/hostile, tests/fuzz, tests/e2e/default_system: one
system for the whole package) is one unit, so its system starts once in the whole run. Units go out
heaviest first: those with a test marked slow, then those that start whole systems (the
shared packages and fuzz before single e2e modules), then those that start single services,
then the rest, so the last minutes are spent on short units on every worker rather than on
one long one.

xdist's own `--dist loadgroup` would group by marks, but it renames each test's node id to
do it, which pytest 9 no longer lets a plugin do; a scheduler that reads the unit from the
node id needs no renaming.
"""

from __future__ import annotations

from collections.abc import Iterable

from xdist.scheduler import LoadScopeScheduling

# Packages whose tests share package-scoped fixtures: one unit each.
SHARED_PACKAGES = ("tests/hostile", "tests/fuzz", "tests/e2e/default_system")
# Units with a test marked slow go first (a model build); then, by folder (the first that
# holds the test), those that start whole systems (the shared packages and fuzz, a minute or
# more each, before the e2e modules), then those that start services, then the rest.
SLOW = 0
WEIGHT = {
    "tests/fuzz": 1,
    "tests/hostile": 1,
    "tests/e2e/default_system": 1,
    "tests/e2e": 2,
    "tests/service": 3,
}
LAST = 4


def unit(nodeid: str) -> str:
    """The unit of the test `nodeid`: its package where that shares fixtures, else its file."""
    path = nodeid.split("::", 1)[0]
    return next((p for p in SHARED_PACKAGES if path.startswith(f"{p}/")), path)


def weight(nodeid: str, slow: bool = False) -> int:
    """0 for a test marked slow, 1 or 2 for one that starts whole systems, 3 for one that
    starts services, 4 for the others."""
    if slow:
        return SLOW
    path = nodeid.split("::", 1)[0]
    return next((w for folder, w in WEIGHT.items() if path.startswith(f"{folder}/")), LAST)


def unit_weights(tests: Iterable[tuple[str, bool]]) -> dict[str, int]:
    """Each unit's weight, its heaviest test's, from (node id, marked slow) of every test."""
    weights: dict[str, int] = {}
    for nodeid, slow in tests:
        name = unit(nodeid)
        weights[name] = min(weights.get(name, LAST), weight(nodeid, slow))
    return weights


class Units(LoadScopeScheduling):
    """xdist's scope scheduling, with `unit` as the scope; units go out in collection order,
    which the workers sort by `weight`."""

    def _split_scope(self, nodeid: str) -> str:
        return unit(nodeid)
