"""The threads a preprocess replica runs steps on: a pool of `preprocess.threads` workers for
calls too big for the event loop, and the steps' native libraries held to as many.

Without a bound, one replica hands every large call to asyncio's default pool (cores + 4
threads), runs several calls' steps at once, and each library may start a pool of its own
per core (Hugging Face tokenizers' Rust pool, OpenBLAS): one replica then spreads over every
core and contends with the other replicas for them, so adding a replica adds no throughput.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from threadpoolctl import threadpool_limits

# Read by the Rust thread pool that tokenizers' batch encoding starts on first use.
RAYON_THREADS = "RAYON_NUM_THREADS"


def step_pool(threads: int) -> ThreadPoolExecutor:
    """The pool that runs large calls' steps, with the native libraries held to `threads`."""
    os.environ[RAYON_THREADS] = str(threads)
    threadpool_limits(limits=threads)  # OpenBLAS/OpenMP already loaded (numpy's)
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="preprocess-steps")
