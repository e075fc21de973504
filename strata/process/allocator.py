"""glibc's allocator, told to keep tensor-sized memory instead of handing it back each time.

A request's tensors are hundreds of KiB to a few MiB (a 224x224 RGB image in FP32 is 600 KB,
its decoded JPEG and resize buffers more). glibc serves such blocks with mmap and returns
them with munmap, and trims the heap's top once 128 KiB are free there, so every request
maps fresh pages and faults each one in: measured on the preprocess service, 1.5 to 1.8 ms
of system time per image against 0.25 to 0.45 ms with the settings below (bench.images'
pipeline, same run). Serving processes therefore keep blocks up to MMAP_THRESHOLD in the heap
and trim it only past TRIM_THRESHOLD of free memory: resident memory settles at the working
set of a few requests and stays there.

An operator's own MALLOC_MMAP_THRESHOLD_ or MALLOC_TRIM_THRESHOLD_ wins (glibc read it at
start, and it is not touched); another C library (musl) is left as it is.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # mallopt's parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 1024 * 1024  # glibc's largest: blocks below it come from the heap
TRIM_THRESHOLD = 64 * 1024 * 1024  # free memory the heap keeps before giving it back
OPERATOR_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_tensor_memory() -> bool:
    """Apply the thresholds above to this process; whether they were applied."""
    if any(name in os.environ for name in OPERATOR_SETTINGS):
        return False
    mallopt = _mallopt()
    if mallopt is None:
        return False
    applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
    if not applied:
        log.warning("glibc refused the allocator thresholds; tensors are mapped per request")
    return applied


def _mallopt() -> Callable[[int, int], int] | None:
    # The process's own symbols, the C library's among them: ctypes.util.find_library("c")
    # would run ldconfig, some 50 ms of every service's start.
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # not glibc
        return None
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt
