"""A client request as the gateway carries it, with its caller and deadline, and the answer
it gets."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from strata.config.pipelines import Pipeline, Route
from strata.wire.codec import Arrays
from strata.wire.deadline import Deadline
from strata.wire.stack import Raw
from strata.wire.triton_sequences import Flags


@dataclass(frozen=True)
class Caller:
    """A request's sender as admission, budgets and metrics see it."""

    metadata: Mapping[str, str]  # gRPC metadata or HTTP headers, names in lower case
    peer: str  # gRPC's form: ipv4:10.0.0.1:5123, ipv6:[::1]:5123
    time_remaining: float | None  # seconds until the caller's deadline; None: none set
    protocol: str = "grpc"
    principal: str | None = None  # whom its verified client certificate names (security.py)


@dataclass(eq=False)
class ClientRequest:
    pipeline_name: str
    pipeline: Pipeline
    arrays: Arrays  # decoded views, for validation and the cache
    inputs: list[Raw]  # the same tensors as they came, forwarded without decoding
    request_id: str
    client: str
    forced_arm: str
    # The caller's, or the gateway's default: work past it is dropped before it costs CPU.
    deadline: Deadline
    # The client's string parameters, passed to postprocess rules' `when:` conditions.
    parameters: dict[str, str] = field(default_factory=dict)
    # Its place in a sequence, for a stateful pipeline (services/gateway/upstream/sequences.py).
    sequence: Flags | None = None
    # Set by the orchestrator before the request boards its flight.
    route: Route | None = None
    version: str = ""
    level: int = 0
    # Who sent it, for the policies asked as it boards (None where a test builds it bare).
    caller: Caller | None = None


@dataclass
class Answer:
    outputs: Arrays
    arm: str
    model_version: str
    level: int
    degraded: str = ""  # "", "cache", "default" or "early_exit"
    cached: bool = False
    skipped_rules: str = ""
    stages: str = ""  # a pipeline of several models: those that answered, in order
