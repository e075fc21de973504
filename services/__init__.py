"""Strata's four services, one folder a layer, each started as `python -m services.<layer>`.

Each imports the shared package `strata` and no other service (import-linter holds both).
"""

# gRPC reads GRPC_EXPERIMENTS once, when first imported: choose the transport before any
# service module can import grpc (strata/transport.py says why).
from strata import transport as _transport  # noqa: F401
