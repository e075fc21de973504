"""Client channels to the next hop: tracing, message limits, balancing and retries.

Retries and round-robin balancing come from gRPC's own service config, not hand-written
loops: a call that fails with UNAVAILABLE is retried, on another replica where there is one.
"""

from __future__ import annotations

import json

import grpc

from strata.config import ServerSettings
from strata.server import grpc_options
from strata.telemetry import client_interceptors


def service_config(services: list[str], max_attempts: int = 3) -> str:
    """A gRPC service config: round-robin over resolved addresses, retry UNAVAILABLE."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"round_robin": {}}],
            "methodConfig": [
                {
                    "name": [{"service": name} for name in services],
                    "retryPolicy": {
                        "maxAttempts": max_attempts,
                        "initialBackoff": "0.01s",
                        "maxBackoff": "0.2s",
                        "backoffMultiplier": 2,
                        "retryableStatusCodes": ["UNAVAILABLE"],
                    },
                }
            ],
        }
    )


def open_channel(target: str, settings: ServerSettings, services: list[str]) -> grpc.aio.Channel:
    """An insecure traced channel to `target` with retries for the given service names."""
    options = [
        *grpc_options(settings),
        ("grpc.service_config", service_config(services)),
        ("grpc.enable_retries", 1),
    ]
    return grpc.aio.insecure_channel(target, options=options, interceptors=client_interceptors())
