"""One running system shared by the fuzz tests of a module (a module may start its own)."""

from tests.support.fixtures import system as system  # re-exported: pytest finds fixtures here
