"""The controller's rewritten test modules: written once, read as pytest reads its own."""

from __future__ import annotations

from pathlib import Path
from types import CodeType

import pytest
from _pytest.assertion.rewrite import PYC_TAIL, _read_pyc

from tests.support.rewritten import write_all


def test_each_test_module_and_conftest_is_written_once(
    request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    (tmp_path / "test_one.py").write_text("def test_it():\n    assert 1 + 1 == 3\n")
    (tmp_path / "conftest.py").write_text("")
    (tmp_path / "helpers.py").write_text("")  # imported as any module: not rewritten
    assert write_all(request.config, tmp_path) == 2
    cached = sorted(p.name for p in (tmp_path / "__pycache__").iterdir())
    assert cached == [f"conftest{PYC_TAIL}", f"test_one{PYC_TAIL}"]
    code = _read_pyc(tmp_path / "test_one.py", tmp_path / "__pycache__" / f"test_one{PYC_TAIL}")
    assert code is not None
    functions = [c for c in code.co_consts if isinstance(c, CodeType)]
    assert any(name.startswith("@py_assert") for f in functions for name in f.co_varnames)
    assert write_all(request.config, tmp_path) == 0, "what is up to date is not written again"


def test_a_changed_source_is_written_again(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source = tmp_path / "test_one.py"
    source.write_text("def test_it():\n    assert True\n")
    write_all(request.config, tmp_path)
    source.write_text("def test_it():\n    assert not False\n")
    assert write_all(request.config, tmp_path) == 1
