"""The gateway's policy settings: rate limits, the degradation ladder, cache, breaker, admin.

These are the settings that are safe to change live: the admin API's reload applies them to a
running gateway without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, TypeAdapter, ValidationError, model_validator

from strata import yamltext
from strata.config.base import (
    LIVE,
    AdminToken,
    Strict,
    admin_token_from,
    first_error,
    not_both,
    read_secret,
)

# What a key may do beyond inference: force_arm, send requests to the A/B arm named in
# `strata.arm` (also one of weight 0, rolled back).
Capability = Literal["force_arm"]


class ApiKey(Strict):
    """A client's API key, stored only as its SHA-256."""

    client_id: str = Field(min_length=1, description="Who the key belongs to.")
    sha256: str = Field(
        pattern=r"^[0-9a-f]{64}$",
        description="Hex SHA-256 of the key (`python -m strata.security.credentials`).",
    )
    capabilities: list[Capability] = Field(
        default_factory=list,
        description="What the key may do beyond inference: force_arm lets its requests "
        "choose their A/B arm with the strata.arm parameter, a rolled-back (weight 0) one "
        "included; without it they are refused PERMISSION_DENIED.",
    )


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
    peer_clients: float = Field(
        default=100,
        gt=0,
        description="Without api_keys, each peer address (the host, without the port) also has "
        "a bucket of this many clients' per_client (its rate and burst multiplied), so a caller "
        "that rotates client ids or unregistered keys stays limited. With api_keys, each key "
        "is limited alone, wherever it calls from.",
    )
    max_clients: int = Field(
        default=10_000,
        gt=0,
        description="Buckets kept (of clients, and of peers); the least recently seen go first.",
    )


class Ladder(Strict):
    """When the gateway degrades: live signals against limits, with hysteresis."""

    overload_share: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Share of a pipeline's calls (over `window_seconds`) the door may refuse "
        "for want of capacity before pressure is 1: "
        "overload, which an open loop past capacity shows and a closed loop never does. The "
        "congestion signals (queueing delay, latency, the wait before the door, the event "
        "loop's lag) move the level only while it is at 1 or more (docs/gateway.md, ladder).",
    )
    queue_delay_share: float = Field(
        default=0.25,
        gt=0,
        description="Share of a pipeline's latency objective its P95 queueing delay (admission "
        "to its flight leaving, plus the event loop's lag) may reach before pressure is 1.",
    )
    error_rate_limit: float = Field(
        default=0.2, gt=0, le=1, description="Upstream error share at which pressure reaches 1."
    )
    rejection_rate_limit: float = Field(
        default=0.05, gt=0, le=1, description="Share of queue rejections at which pressure is 1."
    )
    min_error_samples: int = Field(
        default=50,
        ge=1,
        description="Upstream outcomes the window must hold before the error and rejection "
        "shares count, so that a handful of failures (one client's bad input, say) at low "
        "load cannot raise the level for everyone.",
    )
    loop_lag_limit_ms: float = Field(
        default=100.0,
        gt=0,
        description="Event-loop lag at which pressure reaches 1: requests queued in gRPC "
        "before any handler runs show only as a loop that falls behind.",
    )
    door_wait_share: float = Field(
        default=1.0,
        ge=0,
        description="Share of a pipeline's latency objective calls may spend waiting before the "
        "door, in gRPC's queue before any handler runs, before pressure is 1; measured by the "
        "gateway's own probe through the door each tick (the median of the window's probes). "
        "0 turns the signal off.",
    )
    door_window_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Look-back window of the wait before the door (at most `window_seconds`): "
        "short, as that wait ends soon after answers get cheaper.",
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
        description="At level 4, the share of each pipeline's concurrency limit still "
        "admitted; the rest is shed at once. Admitted requests keep the signals fresh, so the "
        "ladder can see recovery.",
    )


class Cache(Strict):
    """The result cache (bounded, with a time to live)."""

    max_entries: int = Field(default=10_000, ge=0, description="Answers kept; 0 disables it.")
    ttl_seconds: float = Field(default=60.0, gt=0, description="How long an answer stays fresh.")
    keep_from_level: int = Field(
        default=1,
        ge=0,
        le=3,
        description="For a pipeline without its own `cache`, the lowest degradation level at "
        "which its full answers are kept (keyed by a SHA-256 of the inputs) for level 3 to "
        "answer from. The ladder climbs one level at a time, so the answers of its climb are "
        "there when it reaches 3; below this level no answer is hashed or kept (0: every "
        "answer, as a forced jump from 0 to 3 may want, at about 0.1 ms of CPU a 150 KB "
        "photo).",
    )


class Breaker(Strict):
    """Circuit breaking of an upstream that keeps failing."""

    failures: int = Field(default=5, ge=1, description="Consecutive failures that open it.")
    open_seconds: float = Field(
        default=2.0, gt=0, description="How long it stays open before one probe call."
    )


class HopTimeouts(Strict):
    """Each upstream call's own timeout, from how long that hop normally takes for the work
    the call carries."""

    multiplier: float = Field(
        default=5.0,
        gt=1,
        description="The timeout is this multiple of the hop's recent P99 for what the call "
        "carries (per call, per row times its rows, per byte times its bytes, whichever is "
        "longest, plus the same for the calls the hop has not answered yet), learned apart "
        "for each pipeline or model and bounded by floor_seconds and "
        "upstream_timeout_seconds; a hop that misses it counts as failing.",
    )
    floor_seconds: float = Field(
        default=0.1, gt=0, description="The shortest timeout a hop is ever given."
    )
    window: int = Field(
        default=512,
        ge=16,
        description="Recent answered calls (of one pipeline or model) the P99 is of.",
    )
    min_samples: int = Field(
        default=32,
        ge=1,
        description="Answered calls of a pipeline or model needed before their timeout adapts "
        "(until then: upstream_timeout_seconds).",
    )


class FlightSettings(Strict):
    """How the gateway carries concurrent client requests through the chain together."""

    max_in_air: int = Field(
        default=2,
        ge=1,
        description="Flights travelling the chain at once. A request of a queue with nothing "
        "in the air leaves at once (with whatever arrived in the same event-loop turn); while "
        "some of the queue's requests are in the air, its next flight leaves once it holds the "
        "queue's recent load over max_in_air, is full, has waited its `linger`, or the queue's "
        "flights have landed.",
    )
    linger: float = Field(
        default=0.5,
        ge=0,
        description="Of a queue's recent time in the air, how long its next flight may wait for "
        "its share of the queue's load while some of the queue's requests are in the air "
        "(docs/gateway.md, Flights). 0: it leaves whenever fewer than max_in_air travel.",
    )
    max_requests: int = Field(default=64, ge=1, description="Client requests one flight carries.")
    max_rows: int = Field(
        default=256, ge=1, description="Rows one flight carries (a request of 5 rows counts 5)."
    )
    message_margin: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="Share of server.max_message_bytes a flight leaves unused when it is sized "
        "by the bytes per row its pipeline's messages recently carried: against rows larger "
        "than recent ones and each message's framing (docs/gateway.md, Flights).",
    )


class Concurrency(Strict):
    """Adaptive concurrency at the door: how many requests may be in the chain at once."""

    initial: int = Field(default=64, ge=1, description="The limit before any latency is seen.")
    min_limit: int = Field(default=4, ge=1, description="The limit never falls below this.")
    max_limit: int = Field(default=512, ge=1, description="The limit never grows past this.")
    tolerance: float = Field(
        default=2.0,
        ge=1,
        description="Recent latency may reach this multiple of the baseline before the limit "
        "shrinks (Gradient2's tolerance).",
    )
    objective_share: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Recent median latency above this share of the pipeline's latency "
        "objective shrinks the limit whatever the baseline says.",
    )
    update_seconds: float = Field(
        default=0.1, gt=0, description="How often the limit is recomputed from new latencies."
    )
    min_samples: int = Field(default=8, ge=1, description="Latencies needed for an update.")
    baseline_updates: int = Field(
        default=100,
        ge=1,
        description="Updates the baseline averages over (an EWMA of the recent medians).",
    )
    contention: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Share of the limit in use beyond which each client may hold at most an "
        "equal share of the limit among the clients holding requests.",
    )
    wait_share: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="A request beyond the limit whose caller set a deadline waits for a place "
        "(newest first once the queue backs up) up to this share of its pipeline's latency "
        "objective and never past its deadline, then is refused; 0 refuses at once. At 0.25, a "
        "closed loop of 64 on one connection saw up to 123 refusals in 8 s below capacity; at "
        "1.0, none. One whose caller set no deadline waits in turn until a place frees or "
        "`gateway.default_timeout_seconds` runs out (docs/gateway.md, Admission).",
    )
    backlog_share: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="While calls wait before the door (in gRPC's queue, measured by the "
        "gateway's own probe) longer than this share of a pipeline's latency objective, a call "
        "whose caller set a deadline is refused on arrival (RESOURCE_EXHAUSTED, reason "
        "`backlog`), before its inputs are read: the queue is held near it, and what is "
        "admitted has the rest of the objective. Only a client that sends at least half an "
        "equal share of the recent calls is refused for it, so a flooding client's queue "
        "does not refuse a polite client's calls. 0 never refuses for it "
        "(docs/gateway.md, Admission).",
    )
    max_waiting: int = Field(
        default=1024,
        ge=0,
        description="Requests that may wait for a place, per pipeline; one more is refused at "
        "once. It bounds what callers without deadlines, who wait as long as it takes, can "
        "make the gateway hold.",
    )
    min_share: int = Field(
        default=8,
        ge=1,
        description="A client's fair share never falls below this many requests in the chain: "
        "under contention each client may hold the larger of this and an equal share of the "
        "limit, so one below it is never refused for its share when the limit shrinks (while "
        "the chain is full it waits, ahead of clients over their share).",
    )
    refusal_log_seconds: float = Field(
        default=10.0,
        gt=0,
        description="The door logs each refusal reason at most once per this many seconds, "
        "with the counts since its last line.",
    )
    refusal_clients: int = Field(
        default=32,
        ge=0,
        description="Clients strata_gateway_refusals_total names in its client label (the "
        "first refused); later ones count as '(other)', so the label stays bounded.",
    )


class SharedMemory(Strict):
    """System shared memory regions clients register to pass tensors (Triton's extension)."""

    enabled: bool = Field(
        default=False,
        description="Serve system shared memory. A client on the gateway's host registers a "
        "POSIX shared memory object by its key; any client that can reach the gateway may "
        "name any object the gateway's user can open, so enable it only where clients are "
        "trusted with that (a laptop, a sidecar).",
    )
    root: Path = Field(
        default=Path("/dev/shm"),
        description="Where the host keeps POSIX shared memory objects: key /name is the file "
        "root/name.",
    )
    max_regions_per_client: int = Field(
        default=16, ge=1, description="Regions one client (its identity) may hold at once."
    )
    max_regions: int = Field(default=1024, ge=1, description="Regions all clients hold at once.")
    max_region_bytes: int = Field(
        default=1 << 30, gt=0, description="Largest region a client may register."
    )


class Rest(Strict):
    """What one REST request may send, checked before its body is parsed (the tensors in it
    are then checked against `limits` as on gRPC)."""

    max_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        gt=0,
        description="Largest request body, JSON and binary tensor data together (413 beyond).",
    )
    max_json_depth: int = Field(
        default=16,
        ge=4,
        le=64,
        description="Deepest nesting of JSON arrays and objects: the request, its inputs and a "
        "tensor's nested `data` (a rank-r tensor needs r + 3).",
    )
    max_json_values: int = Field(
        default=1 << 20,
        gt=0,
        description="Most values one JSON body holds: each becomes a Python object when "
        "parsed, so this bounds what a body costs; larger tensors go as binary data.",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A connection's request header must arrive whole within this long of its "
        "first byte (or of the connection, for the first request); otherwise it is answered "
        "408 and closed. An idle connection between requests is closed after 5 s.",
    )
    forwarded_allow_ips: list[str] = Field(
        default_factory=list,
        description="Addresses or networks of proxies whose X-Forwarded-For and "
        "X-Forwarded-Proto headers are believed (the caller's address then comes from them); "
        "empty: no one's, the caller is the connection's own address.",
    )


class GatewaySettings(Strict):
    """Gateway policies."""

    max_streams_per_client: int | None = Field(
        default=64,
        gt=0,
        description="ModelStreamInfer streams one client (its API key's client, its "
        "certificate's principal, else its client id or address) may hold open at once; one "
        "more is refused RESOURCE_EXHAUSTED. A stream is identified as it opens, so without a "
        "valid key (when keys are required) it is refused UNAUTHENTICATED before it is held. "
        "null: no limit. Read at start.",
    )
    default_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Budget of a request whose caller set no deadline.",
        json_schema_extra=LIVE,
    )
    ready_when: Literal["every_pipeline", "any_deployment"] = Field(
        default="every_pipeline",
        description="When ServerReady (REST /v2/health/ready) answers true. every_pipeline: "
        "preprocess and postprocess are healthy and every pipeline can answer, each of its "
        "models (or that model's fallback) ready on one of its routes, as Triton's strict "
        "readiness. any_deployment: preprocess, postprocess and at least one inference "
        "deployment are healthy, though a pipeline whose deployment is still loading its "
        "models fails until it is up.",
        json_schema_extra=LIVE,
    )
    reconnect_seconds: float = Field(
        default=1.0,
        gt=0,
        description="Longest wait between two tries to connect to a layer that is down or "
        "still starting (gRPC's maximum reconnect backoff, 120 s of its own): a layer that "
        "comes up is used, and the gateway ready, within about this long.",
    )
    upstream_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="Longest one upstream call may take, however much of the client's budget "
        "is left; an upstream that misses it counts as failing (UNAVAILABLE, breaker).",
        json_schema_extra=LIVE,
    )
    hop_timeouts: HopTimeouts = Field(
        default_factory=HopTimeouts,
        description="Upstream calls' own timeouts, adaptive.",
        json_schema_extra=LIVE,
    )
    stream_lanes: int = Field(
        default=2,
        ge=0,
        description="Streams the gateway keeps open to each replica of each layer (each "
        "inference deployment, each preprocess replica, postprocess; the replicas behind one "
        "`target` share them); a flight's call to the layer is one message on the least busy "
        "replica's least busy one, at about half a unary call's cost. 0: a unary call each.",
    )
    split_flight_bytes: int = Field(
        default=1048576,
        ge=1,
        description="A flight's call to a layer whose replicas the gateway knows (local "
        "replicas, each on its own address) is cut into parts of at least this many bytes of "
        "tensors, up to 2 for each replica that takes messages; the replicas take them as "
        "each has room (replica_messages), so they work on one big flight at once (photos "
        "through preprocess) and a faster one takes more, instead of one replica on all of "
        "it while another idles. Parts are whole requests; a pipeline whose outputs differ in "
        "shape by part (padded text) is sent whole from then on. Each part is a message more "
        "for the gateway, which a flight smaller than this (seven 640x480 photos at 1 MiB) "
        "does not repay: the other flight in the air keeps the other replica busy.",
        json_schema_extra=LIVE,
    )
    replica_messages: int = Field(
        default=2,
        ge=1,
        description="Messages the gateway sends each replica of preprocess or postprocess at "
        "once, where it knows the replicas (local replicas, each on its own address); more "
        "wait in the gateway and go to the first replica to answer one, so that no replica "
        "holds a queue while another idles. 2: the next message is in a replica's hands while "
        "it works on the current one.",
    )
    rate_limits: RateLimits = Field(
        default_factory=RateLimits, description="Token buckets.", json_schema_extra=LIVE
    )
    concurrency: Concurrency = Field(
        default_factory=Concurrency,
        description="Adaptive concurrency limit and fair shares.",
        json_schema_extra=LIVE,
    )
    ladder: Ladder = Field(
        default_factory=Ladder, description="The degradation ladder.", json_schema_extra=LIVE
    )
    cache: Cache = Field(
        default_factory=Cache, description="The result cache.", json_schema_extra=LIVE
    )
    breaker: Breaker = Field(
        default_factory=Breaker, description="Upstream circuit breakers.", json_schema_extra=LIVE
    )
    flights: FlightSettings = Field(
        default_factory=FlightSettings,
        description="Flights: concurrent requests through every hop in one call each.",
        json_schema_extra=LIVE,
    )
    processes: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Gateway processes sharing the public gRPC and REST ports (and the admin "
        "and probe ones), each on a core of its own with its own door, flights, ladder and "
        "cache; the kernel hands each connection to one of them, so a client on one "
        "connection is served by one process. Above 1, `python -m services.gateway` starts "
        "them and restarts one that dies, and serves the metrics page summed over them; an "
        "admin Reload reaches every process, while SetWeights, ForceLevel and the log and "
        "trace settings are refused (they would reach one): change the file and Reload. Set "
        "it to the cores the gateway is given (docs/gateway.md). Read at start.",
    )
    rest: Rest = Field(default_factory=Rest, description="The REST API's request limits.")
    shared_memory: SharedMemory = Field(
        default_factory=SharedMemory,
        description="System shared memory (register, status, unregister; tensors by region).",
    )
    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description="Clients' API keys (hashed); when any are set, requests without a valid "
        "key in the api_key_header are refused UNAUTHENTICATED.",
        json_schema_extra=LIVE,
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A YAML file of more API keys, a list like api_keys (a mounted secret; "
        "relative to the config file), read at start and again by every config reload.",
        json_schema_extra=LIVE,
    )
    admin_token: AdminToken = Field(
        default=None,
        description="Token the admin API and model repository control (RepositoryIndex, "
        "RepositoryModelLoad, RepositoryModelUnload and their REST routes) require "
        "(STRATA_GATEWAY__ADMIN_TOKEN), at least 32 characters; unset or empty disables both.",
        json_schema_extra=LIVE,
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="A file holding the admin token instead (a mounted secret; relative to "
        "the config file), read at start and again by every config reload, so a rotated "
        "token applies live.",
        json_schema_extra=LIVE,
    )

    local_model_control: bool = Field(
        default=False,
        description="For local development only: model repository control (RepositoryIndex, "
        "RepositoryModelLoad, RepositoryModelUnload and their REST routes) without the admin "
        "token, as Triton serves it in explicit model control mode, and each inference "
        "deployment's repository API without inference.admin_token. Refused at start unless "
        "the gateway's gRPC and REST listeners and every inference deployment bind loopback "
        "addresses: anyone who reaches those ports can load and unload models. Off: control "
        "needs the tokens.",
    )

    @model_validator(mode="after")
    def _one_admin_token(self) -> GatewaySettings:
        not_both(self, "admin_token", "admin_token_file")
        return self

    def with_files(self, base: Path) -> GatewaySettings:
        """A copy with api_keys_file and admin_token_file read into api_keys and admin_token
        (relative paths against `base`); ValueError naming the setting when one is unusable."""
        update: dict[str, object] = {}
        if self.api_keys_file is not None:
            update["api_keys"] = [*self.api_keys, *_api_keys_from(self.api_keys_file, base)]
        if self.admin_token_file is not None:
            setting = "gateway.admin_token_file"
            update["admin_token"] = admin_token_from(self.admin_token_file, base, setting)
        return self.model_copy(update=update)


_API_KEYS = TypeAdapter(list[ApiKey])


def _api_keys_from(path: Path, base: Path) -> list[ApiKey]:
    setting = "gateway.api_keys_file"
    text = read_secret(path, base, setting)
    try:
        return _API_KEYS.validate_python(yamltext.safe_load(text) or [])
    except yaml.YAMLError:
        raise ValueError(f"{setting}: {path} is not valid YAML") from None
    except ValidationError as exc:
        raise ValueError(f"{setting}: {path}: {first_error(exc)}") from None
