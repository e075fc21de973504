"""The allocator thresholds: applied at a service's start, unless the operator set their own
(tests/e2e/test_tensor_memory.py measures what they buy in a real preprocess process)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = [
    pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt"),
    pytest.mark.slow,  # each test starts a Python process that imports the services
]

# Applies the thresholds, or not, and says so.
APPLY = """
from strata.process.allocator import keep_tensor_memory
print(keep_tensor_memory())
"""


def applied(**env: str) -> bool:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    run = subprocess.run(
        [sys.executable, "-c", APPLY],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return run.stdout.strip() == "True"


def test_a_serving_process_applies_the_thresholds() -> None:
    assert applied()


def test_an_operators_own_malloc_settings_win() -> None:
    assert not applied(MALLOC_TRIM_THRESHOLD_="131072")
