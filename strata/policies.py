"""The gateway's policy settings: rate limits, the degradation ladder, cache, breaker, admin.

These are the settings that are safe to change live: the admin API's reload applies them to a
running gateway without a restart.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator

from strata.security import ApiKey
from strata.strict import Strict


class TokenBucket(Strict):
    """A token bucket: `rate` requests per second on average, bursts of up to `burst`."""

    rate: float = Field(gt=0, description="Sustained requests per second.")
    burst: float = Field(gt=0, description="Requests admitted at once after a quiet spell.")


class RateLimits(Strict):
    """Token buckets per client and for the whole gateway; unset means unlimited."""

    per_client: TokenBucket | None = Field(default=None, description="Each client's bucket.")
    total: TokenBucket | None = Field(default=None, description="One bucket for all clients.")
    client_header: str = Field(
        default="x-client-id", description="Metadata key naming the client (else the peer)."
    )
    api_key_header: str = Field(
        default="x-api-key", description="Metadata key carrying an API key (wins over client id)."
    )
    max_clients: int = Field(
        default=10_000, gt=0, description="Buckets kept; the least recently seen go first."
    )


class Ladder(Strict):
    """When the gateway degrades: live signals against limits, with hysteresis."""

    concurrency_limit: int = Field(
        default=64, gt=0, description="In-flight requests at which pressure reaches 1."
    )
    error_rate_limit: float = Field(
        default=0.2, gt=0, le=1, description="Upstream error share at which pressure reaches 1."
    )
    rejection_rate_limit: float = Field(
        default=0.05, gt=0, le=1, description="Share of queue rejections at which pressure is 1."
    )
    loop_lag_limit_ms: float = Field(
        default=100.0,
        gt=0,
        description="Event-loop lag at which pressure reaches 1: requests queued in gRPC "
        "before any handler runs show only as a loop that falls behind.",
    )
    window_seconds: float = Field(default=5.0, gt=0, description="Signals' look-back window.")
    tick_seconds: float = Field(default=0.25, gt=0, description="How often levels are decided.")
    up_after: int = Field(default=2, ge=1, description="Ticks of pressure ≥ 1 before a step up.")
    down_after: int = Field(
        default=8, ge=1, description="Ticks of pressure below `down_below` before a step down."
    )
    down_below: float = Field(default=0.6, gt=0, lt=1, description="Pressure that counts as calm.")
    max_level: int = Field(default=4, ge=0, le=4, description="Highest level the ladder may reach.")
    shed_retry_ms: int = Field(default=500, ge=0, description="Retry hint when shedding load.")
    shed_admit_fraction: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="At level 4, the share of concurrency_limit still admitted; the rest is "
        "shed at once. Admitted requests keep the signals fresh, so the ladder can see recovery.",
    )


class Cache(Strict):
    """The result cache (bounded, with a time to live)."""

    max_entries: int = Field(default=10_000, ge=0, description="Answers kept; 0 disables it.")
    ttl_seconds: float = Field(default=60.0, gt=0, description="How long an answer stays fresh.")


class Breaker(Strict):
    """Circuit breaking of an upstream that keeps failing."""

    failures: int = Field(default=5, ge=1, description="Consecutive failures that open it.")
    open_seconds: float = Field(
        default=2.0, gt=0, description="How long it stays open before one probe call."
    )


class Flights(Strict):
    """How the gateway carries concurrent client requests through the chain together."""

    max_in_air: int = Field(
        default=2,
        ge=1,
        description="Flights travelling the chain at once; below it a request leaves at once "
        "(with whatever arrived in the same event-loop turn), beyond it requests queue for "
        "the next flight.",
    )
    max_requests: int = Field(default=64, ge=1, description="Client requests one flight carries.")
    max_rows: int = Field(
        default=256, ge=1, description="Rows one flight carries (a request of 5 rows counts 5)."
    )


class GatewaySettings(Strict):
    """Gateway policies."""

    default_timeout_seconds: float = Field(
        default=30.0, gt=0, description="Budget of a request whose caller set no deadline."
    )
    upstream_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Longest one upstream call may take, however much of the client's budget "
        "is left; an upstream that misses it counts as failing (UNAVAILABLE, breaker).",
    )
    rate_limits: RateLimits = Field(default_factory=RateLimits, description="Token buckets.")
    ladder: Ladder = Field(default_factory=Ladder, description="The degradation ladder.")
    cache: Cache = Field(default_factory=Cache, description="The result cache.")
    breaker: Breaker = Field(default_factory=Breaker, description="Upstream circuit breakers.")
    flights: Flights = Field(
        default_factory=Flights,
        description="Flights: concurrent requests through every hop in one call each.",
    )
    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description="Clients' API keys (hashed); when any are set, requests without a valid "
        "key in the api_key_header are refused UNAUTHENTICATED.",
    )
    admin_token: SecretStr | None = Field(
        default=None,
        description="Token the admin API requires (STRATA_GATEWAY__ADMIN_TOKEN); unset or "
        "empty disables the admin API.",
    )

    @field_validator("admin_token")
    @classmethod
    def _empty_is_unset(cls, token: SecretStr | None) -> SecretStr | None:
        return token if token is not None and token.get_secret_value() else None
