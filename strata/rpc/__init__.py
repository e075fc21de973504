"""One service's gRPC life: the entry every `services/<layer>/__main__.py` calls (main),
the server's start-up and shutdown (server), its channels to the next hop (grpc_channels),
and its stream methods on a Unix socket for callers of its host (pipes).
"""
