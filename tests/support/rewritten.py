"""pytest's rewritten test modules, written once before xdist's workers start.

pytest rewrites the asserts of every test module and conftest it imports, and keeps the result
beside the source unless PYTHONDONTWRITEBYTECODE is set; where it is set (as where `make test`
byte-compiles the project first), each worker parsed and rewrote all 200-odd files again, some
3 s of CPU apiece. The controller writes them here instead, as compileall does for the project;
each worker then reads them, checked against its source's hash as pytest always does.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _pytest.assertion.rewrite import (
    PYC_TAIL,
    _read_pyc,
    _rewrite_test,
    _write_pyc,
    assertstate_key,
    get_cache_dir,
)


def write_all(config: pytest.Config, folder: Path) -> int:
    """Write the rewritten module of each test module and conftest under `folder` that has
    none up to date; how many were written."""
    state = config.stash[assertstate_key]
    patterns = ["conftest.py", *config.getini("python_files")]
    written = 0
    for path in sorted(p for p in folder.rglob("*.py") if any(map(p.match, patterns))):
        pyc = get_cache_dir(path) / (path.name[:-3] + PYC_TAIL)
        if _read_pyc(path, pyc) is not None:
            continue
        pyc.parent.mkdir(exist_ok=True)
        source_hash, code = _rewrite_test(path, config)
        written += _write_pyc(state, code, source_hash, pyc)
    return written
