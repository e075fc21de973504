"""A ghz-compatible load tool for KServe v2 endpoints: `python -m bench.load`.

Closed loop (`-c` clients, `-n` requests or `-z` time) or open loop (`--rps`: a fixed
arrival rate, each latency from when its request was due), sent by worker processes that each
run their own asyncio loop and gRPC channels (or, for an `http://` URL, HTTP/1.1
connections to a v2 REST endpoint). The report has ghz's JSON fields.

As a library: build a `Plan`, run it on a `LoadPool`, read the `Results`.
"""

from bench.load.pool import ConnectFailed, LoadPool
from bench.load.results import Results
from bench.load.schedule import Plan

__all__ = ["ConnectFailed", "LoadPool", "Plan", "Results"]
