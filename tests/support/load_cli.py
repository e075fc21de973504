"""`python -m bench.load` run as a user runs it, for the load tool's tests."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

from tests.support.system import ROOT


def run(call: Sequence[str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """The tool with `call` (its target options) and `args`, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "bench.load", *call, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def json_report(call: Sequence[str], *args: str) -> dict:
    """The tool's JSON report of a run that succeeded."""
    done = run(call, *args, "-O", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)
