"""gRPC's transport in a service process: its older TCP one, unless the environment sets
GRPC_EXPERIMENTS. gRPC reads the variable once, when it is first imported, so strata.rpc.main
imports this module before anything imports grpc.

gRPC's EventEngine transport (its default) reads and writes sockets on threads of its own and
hands each completion to the thread polling the completion queue, which hands it on to the
event loop. At light load most of a process's CPU per call went on those hand-offs: 21 futex
calls a request in the gateway, 4 with the older transport, whose polling thread (the one
grpc.aio polls with anyway) does the socket work itself. Side by side on a 2-core VM at one
request in flight, the pipeline's CPU went from 4.0 to 3.3 ms a request and its P50 from 4.3
to 3.4 ms; at 64 in flight it stayed about the same (0.97 and 0.98 ms a request). A bare
grpc.aio stream's message costs each side about 100 us of CPU with it, against 150 to 190 us
without. GRPC_EXPERIMENTS set empty keeps gRPC's default.
"""

from __future__ import annotations

import os

# The EventEngine experiments gRPC turns on by default, off.
POLLING_TRANSPORT = (
    "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
)

# gRPC's older TCP transport in this process, unless the environment says otherwise.
os.environ.setdefault("GRPC_EXPERIMENTS", POLLING_TRANSPORT)
