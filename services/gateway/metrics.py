"""The gateway's Prometheus metrics."""

from prometheus_client import Counter, Gauge, Histogram

from strata.telemetry.metrics import LATENCY_BUCKETS, Children

REQUESTS = Children(Counter(
    "strata_gateway_requests",
    "Client requests answered, by pipeline, status code and protocol (grpc, rest).",
    ["pipeline", "code", "protocol"],
))  # fmt: skip
LATENCY = Children(Histogram(
    "strata_gateway_request_duration_seconds",
    "Time to answer a client request, by pipeline and protocol.",
    ["pipeline", "protocol"], buckets=LATENCY_BUCKETS,
))  # fmt: skip
UPSTREAM_CALLS = Children(Counter(
    "strata_gateway_upstream_calls", "Calls to the layers behind the gateway, by hop and code.",
    ["hop", "code"],
))  # fmt: skip
RATE_LIMITED = Counter(
    "strata_gateway_rate_limited", "Requests refused by a token bucket.", ["scope"]
)
SHED = Counter("strata_gateway_shed", "Requests shed under overload, by reason.", ["reason"])
REFUSALS = Children(Counter(
    "strata_gateway_refusals",
    "Requests the door refused, by reason and client (the first gateway.concurrency."
    "refusal_clients clients refused by name, every later one as '(other)').",
    ["reason", "client"],
))  # fmt: skip
LEVEL = Gauge("strata_gateway_degradation_level", "Current degradation level (0 = normal).")
LEVEL_CHANGES = Counter(
    "strata_gateway_degradation_changes", "Moves between degradation levels.", ["direction"]
)
DEGRADED = Counter(
    "strata_gateway_degraded_answers", "Answers marked degraded, by source.", ["source"]
)
CACHE = Children(Counter("strata_gateway_cache_lookups", "Result cache lookups.", ["result"]))
ARM_REQUESTS = Children(Counter(
    "strata_gateway_arm_requests", "Requests per A/B arm, by status code.",
    ["pipeline", "arm", "code"],
))  # fmt: skip
ARM_LATENCY = Children(Histogram(
    "strata_gateway_arm_duration_seconds", "Inference time per A/B arm.",
    ["pipeline", "arm"], buckets=LATENCY_BUCKETS,
))  # fmt: skip
SHADOW = Counter(
    "strata_gateway_shadow_comparisons", "Shadow answers compared with the primary's.",
    ["pipeline", "result"],
)  # fmt: skip
BREAKER_OPEN = Children(
    Gauge(
        "strata_gateway_breaker_open",
        "1 while an upstream's circuit breaker is open.",
        ["upstream"],
    )
)
FAILOVERS = Counter(
    "strata_gateway_failovers", "Requests moved to another arm after theirs failed.",
    ["pipeline", "from_arm", "to_arm"],
)  # fmt: skip
INFLIGHT = Gauge("strata_gateway_inflight_requests", "Client requests being worked on.")
FLIGHT_REQUESTS = Histogram(
    "strata_gateway_flight_requests",
    "Client requests carried by one flight through the chain.",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128),
)
FLIGHTS_IN_AIR = Gauge("strata_gateway_flights_in_air", "Flights travelling the chain now.")
SEQUENCES = Children(Gauge(
    "strata_gateway_sequences",
    "Live sequences the gateway tracks for each stateful pipeline.", ["pipeline"],
))  # fmt: skip
CONCURRENCY_LIMIT = Children(Gauge(
    "strata_gateway_concurrency_limit",
    "Each pipeline's adaptive limit of requests in the chain at once.", ["pipeline"],
))  # fmt: skip
LADDER_SIGNAL = Children(Gauge(
    "strata_gateway_ladder_signal",
    "Each signal the degradation ladder reads, at its last tick: its value and the "
    "threshold at which its pressure is 1 (seconds, milliseconds for event_loop, or a share).",
    ["signal", "reading"],
))  # fmt: skip
LANES_OPENED = Counter(
    "strata_gateway_lanes_opened",
    "Lanes (long-lived streams to a layer) opened, by hop and transport: pipe (a Unix socket "
    "to a layer of this host) or grpc.",
    ["hop", "transport"],
)
REPLICA_RESTS = Counter(
    "strata_gateway_replica_rests",
    "Times a replica's lanes were set aside for a while (lanes.py REST_SECONDS) after a "
    "message missed the hop's own timeout, by hop and replica (its index among the "
    "endpoint's listens): a replica often rested is hung or far slower than the others.",
    ["hop", "replica"],
)
REPLICA_MESSAGES = Gauge(
    "strata_gateway_replica_messages",
    "Messages sent to a replica on its lanes and not yet answered, by hop and replica.",
    ["hop", "replica"],
)
