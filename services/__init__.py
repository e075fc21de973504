"""Strata's four services, one folder a layer, each started as `python -m services.<layer>`.

Each imports the shared package `strata` and no other service (import-linter holds both).
"""

# Settings a library reads once, set before any service module imports it: gRPC's transport
# (GRPC_EXPERIMENTS, read when grpc is first imported; strata/process/transport.py says why),
# its log level (GRPC_VERBOSITY; strata/process/grpc_logs.py) and pydantic's plugin search
# (before any model is built; strata/process/pydantic_plugins.py).
from strata.process import grpc_logs as _grpc_logs  # noqa: F401
from strata.process import pydantic_plugins as _pydantic_plugins  # noqa: F401
from strata.process import transport as _transport  # noqa: F401
