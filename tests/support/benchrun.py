"""Running a benchmark module as a user would, for tests that check it runs (never how fast)."""

from __future__ import annotations

import subprocess
import sys

from strata.tools.launch import ROOT


def run_bench(*args: str, timeout: float = 180) -> str:
    """`python -m bench.<args>`'s output; fails the test with its tail if it fails."""
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
