"""gRPC's own log lines in a service process: errors only, unless the environment sets
GRPC_VERBOSITY. gRPC reads the variable once, when it is first imported, so each place that
imports strata.process.transport before grpc imports this module beside it.

gRPC's C core writes INFO lines of its own to stderr, outside the service's JSON log: a
channel whose server went says `Got goaway ... Cancelling all calls` as the process ends. A
gateway that could not start printed one after its one-line reason (`gateway: 127.0.0.1:8080
(REST) already in use`), so the last line a reader sees, and a script greps, was gRPC's (seen
in a fresh clone's `make test`). Its warnings and errors still come through at ERROR.
"""

from __future__ import annotations

import os

QUIET = "ERROR"

# gRPC's C core kept to its errors in this process, unless the environment says otherwise.
os.environ.setdefault("GRPC_VERBOSITY", QUIET)
