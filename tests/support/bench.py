"""Running a benchmark's smoke mode from a test, as a user would from the shell."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.system import DEFAULT_CONFIG, ROOT


def run_quick(module: str, out: Path, timeout: float = 180, *options: str) -> str:
    """`python -m <module> --config <default> --quick --out <out> [options]`: its standard
    output; the test fails with the end of its output if it does."""
    command = ["-m", module, "--config", str(DEFAULT_CONFIG), "--quick", "--out", str(out)]
    command += options
    done = subprocess.run(
        [sys.executable, *command],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout
