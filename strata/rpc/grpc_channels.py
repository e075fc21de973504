"""Client channels to the next hop: message limits, balancing and retries.

Retries, round-robin balancing and outlier ejection come from gRPC's own service config, not
hand-written loops: a call that fails with UNAVAILABLE is retried, on another replica where
there is one, and a replica whose calls keep failing (or timing out: hung) is ejected from
the balancing for a while (gRPC's outlier detection, gRFC A50), then tried again.
"""

from __future__ import annotations

import json

import grpc

from strata.config.server import ServerSettings, grpc_options
from strata.config.tls import GATEWAY, TlsSettings
from strata.security.credentials import channel_credentials, channel_options

# Eject a replica for 5 s (longer each time again) once at least half of its last second's
# calls (at least 10) failed; never more than half the replicas, never with only one.
OUTLIER_DETECTION = {
    "interval": "1s",
    "baseEjectionTime": "5s",
    "maxEjectionTime": "30s",
    "maxEjectionPercent": 50,
    "failurePercentageEjection": {
        "threshold": 50,
        "enforcementPercentage": 100,
        "minimumHosts": 2,
        "requestVolume": 10,
    },
    "childPolicy": [{"round_robin": {}}],
}


INITIAL_RECONNECT_MS = 1000  # gRPC's own first wait before connecting again


def service_config(services: list[str], max_attempts: int = 3) -> str:
    """A gRPC service config: round-robin over resolved addresses with outlier ejection,
    retry UNAVAILABLE."""
    return json.dumps(
        {
            "loadBalancingConfig": [{"outlier_detection_experimental": OUTLIER_DETECTION}],
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


def open_channel(
    target: str,
    settings: ServerSettings,
    services: list[str],
    tls: TlsSettings,
    reconnect_seconds: float,
) -> grpc.aio.Channel:
    """The gateway's channel to a layer at `target` (mutual TLS when on, presenting the
    gateway's identity) with retries for `services`, trying to connect again at least every
    `reconnect_seconds` while the layer is down; callers put trace context in each call's
    metadata (strata.telemetry.tracing.outgoing)."""
    backoff = round(reconnect_seconds * 1000)
    options = [
        *grpc_options(settings),
        *channel_options(tls),
        ("grpc.service_config", service_config(services)),
        ("grpc.enable_retries", 1),
        ("grpc.initial_reconnect_backoff_ms", min(backoff, INITIAL_RECONNECT_MS)),
        ("grpc.max_reconnect_backoff_ms", backoff),
    ]
    credentials = channel_credentials(tls)
    if credentials is None:
        return grpc.aio.insecure_channel(target, options=options)
    return grpc.aio.secure_channel(target, credentials, options=options)


def blocking_channel(target: str, tls: TlsSettings, identity: str = GATEWAY) -> grpc.Channel:
    """A plain synchronous channel (health checks, tools), with TLS when on, presenting
    `identity`."""
    credentials = channel_credentials(tls, identity)
    if credentials is None:
        return grpc.insecure_channel(target)
    return grpc.secure_channel(target, credentials, options=channel_options(tls))
